"""The CLI end to end on the demo config: exit 0 (all within tolerance), 1 (divergence), 2 (bad input)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from support.processes import run_cli
from onnx import numpy_helper

from tvm_probe import UnknownNameError, demo, load_dump
from tvm_probe.app.cli import main

CONFIGS = Path(__file__).parents[2] / "configs"
TAMPERED = "tf_bert_for_sequence_classification/bert/encoder/layer_._1/attention/self/query/kernel:0"


cli = run_cli


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """`tvm-probe run configs/demo.yaml` as the README runs it, into a temporary folder."""
    out = tmp_path_factory.mktemp("demo")
    proc = cli("run", CONFIGS / "demo.yaml", "--set", f"output.dump={out / 'dump'}",
               "--set", f"output.report={out / 'report'}")
    return proc, out


def test_demo_config_passes_and_writes_dump_and_report(demo_run):
    proc, out = demo_run
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == (
        "all 126 compared values within tolerance; default tolerance by dtype "
        "(float32 atol 0.0001, rtol 0.001, int64 exact)")
    assert "Traceback" not in proc.stderr
    reader = load_dump(out / "dump")
    assert reader.metadata["model"] == {"demo": {"preset": "tiny"}}
    assert (out / "report" / "report.html").is_file() and (out / "report" / "nodes.csv").is_file()


def test_ls_get_compare_report_graph_on_the_dump(demo_run, tmp_path):
    _, out = demo_run
    dump = out / "dump"
    ls = cli("ls", dump, "*/attention/self/Softmax")
    assert ls.returncode == 0 and ls.stdout.count("Softmax:0") == 2
    saved = tmp_path / "x.npy"
    get = cli("get", dump, "layer_._0/attention/self/MatMul", "-o", saved)
    assert get.returncode == 0, get.stderr
    np.testing.assert_array_equal(np.load(saved), load_dump(dump).get("layer_._0/attention/self/MatMul"))
    compare = cli("compare", dump)
    assert compare.returncode == 0, compare.stderr
    assert "within tolerance" in compare.stdout
    report = cli("report", dump, "-o", tmp_path / "rep")
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "rep" / "report.html").is_file()
    graph = cli("graph", dump, "-o", tmp_path / "g.dot")
    assert graph.returncode == 0 and (tmp_path / "g.dot").read_text().lstrip().startswith("digraph")
    bad = cli("graph", dump, "-o", tmp_path / "g.png")
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "tvm-probe: error: cannot write a graph as .png: use a .dot or .svg file name")


def test_tampered_reference_weight_exits_1_and_names_the_first_divergent_op(tmp_path, capsys):
    model = demo.tiny_bert()
    onnx.save(model, tmp_path / "model.onnx")
    for init in model.graph.initializer:
        if init.name == TAMPERED:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    onnx.save(model, tmp_path / "tampered.onnx")
    np.savez(tmp_path / "inputs.npz", **demo.demo_inputs(model))
    config = tmp_path / "c.yaml"
    config.write_text("model: {onnx: model.onnx}\npipeline: fused\n"
                      "inputs: {input_ids: {file: inputs.npz}, attention_mask: {file: inputs.npz}}\n"
                      "reference: {runtime: onnxruntime, model: tampered.onnx}\noutput: {report: rep}\n")
    code = main(["--quiet", "run", str(config)])
    out = capsys.readouterr().out
    assert code == 1
    verdict = out.strip().splitlines()[-1]
    assert re.fullmatch(r"FAIL: \d+ of 126 compared values out of tolerance; first divergent op: "
                        r"tf_bert_for_sequence_classification/bert/encoder/layer_\._1/attention/self/query/MatMul "
                        r"\(max abs error \d[\d.e+-]*\); default tolerance by dtype \(.*\)", verdict), verdict


@pytest.mark.parametrize("config_text, fragment", [
    ("model: {demo: {}}\npipeline: nope\n", ":2: pipeline: must be one of default, fused, default_build, zero, static_shape_tuning, got 'nope'"),
    ("model: {onnx: nowhere.onnx}\n", ":1: model.onnx: file"),
    ("model: {demo: {}}\ncapture: ['*/NoSuchOp']\noutput: {}\nreference: none\n",
     "capture: pattern '*/NoSuchOp' matches no source value"),
    ("model: {demo: {}}\ninputs:\n  image: {random: {seed: 0}}\nreference: none\n",
     "inputs.image: the model has no such input; its inputs are input_ids, attention_mask"),
])
def test_bad_configs_exit_2_with_one_line(tmp_path, config_text, fragment):
    config = tmp_path / "bad.yaml"
    config.write_text(config_text)
    proc = cli("run", config)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tvm-probe: error: ") and fragment in lines[0], proc.stderr


def test_usage_errors_exit_2(tmp_path):
    proc = cli("frobnicate")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert cli("--help").stdout.count("tvm-probe run CONFIG") == 1


def test_help_lists_each_command_once_and_every_argument(capsys):
    """tvm-probe --help: each command once (with its arguments); every argument of every command has a
    help text; -v (TVM's compile log) only on the commands that build or run a model."""
    import argparse

    from tvm_probe.app.cli import _COMMANDS, _parser

    parser = _parser()
    text = parser.format_help()
    for name in _COMMANDS:
        assert text.count(f"    tvm-probe {name} ") == 1, name
    assert "positional arguments" not in text
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, command in sub.choices.items():
        assert command.prog == f"tvm-probe {name}"
        for action in command._actions:
            assert action.help, f"tvm-probe {name}: {action.dest} has no help text"
    reading = {"ls", "get", "diff", "report", "graph", "view"}
    for name, command in sub.choices.items():
        has_verbose = any("--verbose" in a.option_strings for a in command._actions)
        assert has_verbose == (name not in reading), name
    with pytest.raises(SystemExit):
        main(["get", "some_dump", "name", "-v"])
    assert "unrecognized arguments: -v" in capsys.readouterr().err


def test_split_config_writes_the_plan_and_verifies_the_chain(tmp_path):
    proc = cli("split", CONFIGS / "split-demo.yaml", "--set", f"output.report={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "chained stages match the whole model" in proc.stdout
    import pandas as pd

    plan = pd.read_csv(tmp_path / "split_plan.csv")
    assert "tf_bert_for_sequence_classification/bert/Mul:0" in set(plan["tensor"])
    missing = cli("split", CONFIGS / "demo.yaml")
    assert missing.returncode == 2 and "split: missing" in missing.stderr


def test_compare_refuses_a_different_model(demo_run, tmp_path):
    _, out = demo_run
    other = tmp_path / "other.onnx"
    onnx.save(demo.tiny_bert(seed=1), other)
    proc = cli("compare", out / "dump", "--model", other)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("tvm-probe: error: the model differs from the one the dump was made with "
                                   "(hash mismatch): give the original with --model PATH")


def test_split_balance_proposes_and_verifies(tmp_path):
    proc = cli("split", CONFIGS / "split-demo.yaml", "--set", "split={balance: 1}",
               "--set", f"output.report={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    assert "proposed cuts after tf_bert_for_sequence_classification/bert/encoder/layer_._" in proc.stdout
    assert "chained stages match the whole model" in proc.stdout


def test_global_options_work_after_the_command_too(demo_run):
    _, out = demo_run
    proc = cli("ls", out / "dump", "*/self/Softmax", "-q")
    assert proc.returncode == 0, proc.stderr


def test_ls_matches_every_name_of_a_value(demo_run):
    _, out = demo_run
    by_tensor = cli("ls", out / "dump", "*Softmax:0")  # a tensor name, not the node name
    assert by_tensor.returncode == 0 and by_tensor.stdout.count("Softmax:0") == 2


def test_version_names_tvm_probe_and_the_tvm_it_runs_on():
    from importlib import metadata

    import tvm_probe

    out = run_cli("--version")
    assert out.returncode == 0
    assert out.stdout.strip() == f"tvm-probe {tvm_probe.__version__} (apache-tvm {metadata.version('apache-tvm')})"


def test_get_says_what_it_prints_and_saves_with_npy(demo_run, tmp_path):
    """``get`` names the value, its dtype, shape and how it was served before printing it."""
    dump = demo_run[1] / "dump"
    name = "layer_._0/attention/self/MatMul"
    reader = load_dump(dump)
    key, value = reader.resolve(name), reader.get(name)
    header = f"{name} ({key}): {value.dtype} {list(value.shape)}, served: {reader.servings[key].served.value}"
    shown = run_cli("get", dump, name)
    assert shown.returncode == 0 and shown.stdout.splitlines()[0] == header
    saved = tmp_path / "v.npy"
    kept = run_cli("get", dump, name, "--npy", saved)
    assert kept.stdout.splitlines() == [header, f"saved to {saved}"]
    np.testing.assert_array_equal(np.load(saved), value)


def test_an_unknown_name_points_to_tvm_probe_ls(demo_run):
    """The CLI's hint names its own command, not Python's ``probe.sources``."""
    dump = demo_run[1] / "dump"
    for args in (("get", dump, "no/such/value"), ("ls", dump, "no/such*")):
        out = run_cli(*args)
        assert out.returncode == 2 and out.stderr.strip().endswith(f"(list names with: tvm-probe ls {dump})")
        assert "probe.sources" not in out.stderr


def test_ls_and_find_list_values_by_op_type(demo_run):
    """Netron shows op types first; the demo BERT's ReduceMean nodes are named .../moments/mean, so
    a pattern on the type finds nothing: --op (Python: find(op=)) lists them, and the miss says so."""
    dump = demo_run[1] / "dump"
    means = [n.name for n in demo.tiny_bert().graph.node if n.op_type == "ReduceMean"]  # the source model
    assert len(means) == 10
    listed = run_cli("ls", dump, "--op", "reducemean")
    assert listed.returncode == 0 and [line.split()[0] for line in listed.stdout.splitlines()[1:]] == means
    assert list(load_dump(dump).find(op="ReduceMean")["name"]) == means
    assert list(load_dump(dump).find("*/LayerNorm/*", op="ReduceMean")["name"]) == means
    missed = run_cli("ls", dump, "*ReduceMean*")
    assert missed.returncode == 2
    assert "'ReduceMean' is an op type here: list its values by type" in missed.stderr
    assert missed.stderr.strip().endswith(f"(list names with: tvm-probe ls {dump} --op ReduceMean)")
    with pytest.raises(UnknownNameError, match=r"is an op type here: list its values by type "
                                               r"\(probe.find\(op='ReduceMean'\)\)$"):
        load_dump(dump).find("*ReduceMean*")
    typo = run_cli("ls", dump, "--op", "ReduceMaen")
    assert typo.returncode == 2 and "no source value comes from an op of type 'ReduceMaen'; did you mean " \
                                   "'ReduceMean'?" in typo.stderr


def test_ls_lists_computed_values_first_and_filters_by_kind(demo_run):
    dump = demo_run[1] / "dump"
    table = load_dump(dump).sources
    listed = run_cli("ls", dump)
    kinds = [line.split()[3] for line in listed.stdout.splitlines()[1:]]  # name, tensor, op_type, kind
    order = {"value": 0, "input": 1, "constant": 2, "param": 3}
    assert listed.returncode == 0 and len(kinds) == len(table)
    assert kinds == sorted(kinds, key=order.__getitem__) and kinds[0] == "value" and kinds[-1] == "param"
    inputs = run_cli("ls", dump, "--kind", "input")
    assert [line.split()[0] for line in inputs.stdout.splitlines()[1:]] == \
        list(table[table["kind"] == "input"]["name"])
