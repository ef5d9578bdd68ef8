"""A dump keeps the terms of its verdict (reference, tolerance, selection): ``compare``, ``report``
and ``view`` on it judge it as its run did, say so, and state a tolerance given instead."""
from __future__ import annotations

from pathlib import Path

import pytest
from support.processes import run_cli

from tvm_probe import load_dump
from tvm_probe.comparison.dump import compare_dump
from tvm_probe.comparison.terms import VerdictTerms, recorded_terms
from tvm_probe.core.errors import ProbeError
from tvm_probe.core.tolerance import Tolerance

CONFIGS = Path(__file__).parents[2] / "configs"


@pytest.fixture(scope="module")
def exact_run(tmp_path_factory):
    """The README's main job with tolerance 0: float rounding makes it fail, as it should."""
    out = tmp_path_factory.mktemp("exact")
    proc = run_cli("run", CONFIGS / "demo.yaml", "--set", "reference.atol=0", "--set", "reference.rtol=0",
                   "--set", f"output.dump={out / 'dump'}", "--set", f"output.report={out / 'report'}")
    assert proc.returncode == 1 and proc.stdout.strip().splitlines()[-1].startswith("FAIL: "), proc.stderr
    return proc, out


def test_the_dump_records_its_verdict_terms(exact_run):
    _, out = exact_run
    terms = recorded_terms(load_dump(out / "dump"))
    assert terms == VerdictTerms(reference="onnxruntime", atol=0.0, rtol=0.0, selection="all")


def test_compare_on_the_dump_keeps_the_runs_verdict_and_says_why(exact_run):
    proc, out = exact_run
    compare = run_cli("compare", out / "dump")
    assert compare.returncode == 1, compare.stderr
    verdict = compare.stdout.strip().splitlines()[-1]
    run_verdict = proc.stdout.strip().splitlines()[-1]
    assert verdict.startswith(run_verdict.split("; tolerance")[0])  # the same failures, the same first op
    assert verdict.endswith("tolerance atol 0, rtol 0; reference onnxruntime and tolerance as recorded in the dump")


def test_a_tolerance_given_on_the_command_line_is_stated_beside_the_recorded_one(exact_run):
    _, out = exact_run
    compare = run_cli("compare", out / "dump", "--atol", "1", "--rtol", "1")
    assert compare.returncode == 0, compare.stderr
    assert compare.stdout.strip().splitlines()[-1] == (
        "all 126 compared values within tolerance; tolerance atol 1, rtol 1; tolerance given on the command "
        "line (the run's: atol 0, rtol 0); reference onnxruntime as recorded in the dump")


def test_report_on_the_dump_carries_the_runs_verdict(exact_run, tmp_path):
    _, out = exact_run
    report = run_cli("report", out / "dump", "-o", tmp_path / "rep")
    assert report.returncode == 0, report.stderr
    assert report.stdout.strip().splitlines()[-1].startswith("FAIL: 115 of 126")
    assert "FAIL" in (tmp_path / "rep" / "report.html").read_text()


def test_a_run_without_reference_is_compared_with_its_kinds_and_says_so(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model: {demo: {num_layers: 1}}\nreference: none\noutput: {dump: dump}\n")
    assert run_cli("run", config).returncode == 0
    reader = load_dump(tmp_path / "dump")
    assert recorded_terms(reader).reference == "none"
    comparison = compare_dump(reader)
    assert comparison and comparison.verdict().endswith(
        "the run compared with no reference: compared here with onnxruntime, its model kind's")
    report = run_cli("report", tmp_path / "dump", "-o", tmp_path / "rep")  # nothing to judge it on: no verdict
    assert report.returncode == 0 and "within tolerance" not in report.stdout


def test_a_tvm_build_reference_is_rebuilt_with_its_recorded_options(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model: {demo: {num_layers: 1}}\npipeline: fused\n"
                      "reference: {tvm: {pipeline: default}}\noutput: {dump: dump}\n")
    assert run_cli("run", config).returncode == 0
    reader = load_dump(tmp_path / "dump")
    terms = recorded_terms(reader)
    assert (terms.reference, terms.reference_options["pipeline"]) == ("tvm", "default")
    comparison = compare_dump(reader)
    assert comparison, comparison.verdict()
    assert comparison.verdict().endswith("reference tvm and tolerance as recorded in the dump")


def test_terms_survive_json_and_unreadable_ones_are_refused():
    terms = VerdictTerms("tvm", {"pipeline": "default"}, 1e-3, None, (("*/Softmax", Tolerance(1e-5, 0.0)),),
                         ("a", "b"))
    assert VerdictTerms.from_json(terms.to_json()) == terms
    assert terms.tolerance_for(["x/Softmax"]) == Tolerance(1e-5, 0.0) and terms.tolerance_for(["x/MatMul"]) is None
    with pytest.raises(ProbeError, match="^the dump's recorded verdict terms are unreadable"):
        VerdictTerms.from_json({"atol": 1})
