"""blame: the stage of TVM responsible, on real TVM 0.27 bugs, against ground truth established by
experiment without tvm_probe (tests/support/tvm_pass_bugs.py and its .md for the pass bugs rebuilt
from apache/tvm reports; tests/support/bug_stages.py and its .md for the reduce bugs)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from support.bug_stages import STAGES
from support.importer_bugs import IMPORTER_BUGS, experiment as importer_experiment
from support.models import cnn_inputs, small_cnn
from support.tvm_bugs import BUGS
from support.tvm_pass_bugs import BUGS as PASS_BUGS
from tvm_probe.tools.blame import STAGES as BLAME_STAGES
from tvm_probe.core.minimize import ddmin
from tvm_probe.tools.blame import blame


def _step_path(path: str, step: str) -> str:
    """The truth's path up to the pipeline step (a failing pass may run inside it: FuseTIRInner)."""
    parts = path.split(">")
    return ">".join(parts[:parts.index(step) + 1])


@pytest.fixture(scope="module")
def pass_blames():
    found = {}
    for name, bug in PASS_BUGS.items():
        found[name] = blame(bug.build(), bug.inputs(), pipeline=bug.pipeline(), target=bug.target or "llvm")
    return found


@pytest.mark.parametrize("name", list(PASS_BUGS))
def test_blame_names_the_pass_of_each_real_pass_bug(name, pass_blames):
    bug, found = PASS_BUGS[name], pass_blames[name]
    assert found.stage == "pass", str(found)
    assert found.pass_name == bug.guilty_pass
    assert found.pass_path == _step_path(bug.pass_path, bug.guilty_pass)
    assert found.failure == ("compile" if bug.kind == "compile" else "divergence")
    if bug.kind == "compile":  # the innermost pass still running is in the evidence
        assert bug.pass_path in str(found) and bug.error_text.split(":")[0][:40] in str(found)


@pytest.mark.parametrize("name", list(PASS_BUGS))
def test_the_pass_repro_fails_standalone_with_the_same_error(name, pass_blames, tmp_path):
    bug, found = PASS_BUGS[name], pass_blames[name]
    folder = found.write_repro(tmp_path / "repro")
    script = (folder / "repro.py").read_text()
    assert "@I.ir_module" in script and f"relax.transform.{bug.guilty_pass}()" in script
    assert "import tvm_probe" not in script and "from tvm_probe" not in script  # tvm and numpy only
    done = subprocess.run([sys.executable, "repro.py"], cwd=folder, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    if bug.kind == "compile":
        assert f"FAILED {bug.error_type.__name__}: " in done.stdout
        assert bug.error_text[:50] in done.stdout + done.stderr
    else:
        assert "MISMATCH output 0" in done.stdout
    assert "blame: pass" in (folder / "README.md").read_text()


def test_a_repro_folder_is_not_overwritten_unless_asked(pass_blames, tmp_path):
    found = pass_blames["combine_parallel_matmul_bias_broadcast"]
    (tmp_path / "repro").mkdir()
    with pytest.raises(Exception, match="already exists"):
        found.write_repro(tmp_path / "repro")
    assert found.write_repro(tmp_path / "repro", overwrite=True).joinpath("repro.py").exists()


@pytest.mark.parametrize("name", list(BUGS))
def test_blame_of_each_reduce_bug_is_the_stage_the_experiment_found(name):
    model, inputs = BUGS[name].build()
    found = blame(model, inputs)
    truth = STAGES[name]
    assert found.stage == truth.stage, f"{found}\ntruth: {truth.evidence}"
    assert found.stage in BLAME_STAGES and found.seconds > 0
    if truth.stage == "kernel" and found.failure == "divergence":  # the op's PrimFunc is shown
        assert found.primfunc and "T.prim_func" in found.primfunc


@pytest.mark.parametrize("name", list(IMPORTER_BUGS))
def test_an_equal_the_importer_folds_to_a_wrong_constant_is_the_importer(name):
    """TVM's ONNX importer decides Equal on shapes at import time, wrongly (tests/support/importer_bugs.md):
    blame says importer, with the constant the experiment found in the imported module."""
    model, inputs = IMPORTER_BUGS[name].build()
    found = blame(model, inputs)
    seen = importer_experiment(name)
    assert (found.stage, found.value) == ("importer", "bug/equal"), str(found)
    constant = np.array2string(np.asarray(seen["imported_constant"]), separator=", ")
    assert f"as the constant {constant}" in str(found)


def test_the_relu_kernel_blame_shows_the_line_that_drops_nan():
    model, inputs = BUGS["relu_nan"].build()
    found = blame(model, inputs)
    assert found.value == "bug/relu" and found.kernel == "relax.nn.relu"
    assert "T.max(" in found.primfunc and "T.float32(0.0)" in found.primfunc  # max(x, 0): NaN lost


def test_a_model_tvm_gets_right_is_blamed_on_nothing():
    model = small_cnn()
    found = blame(model, cnn_inputs(model), pipeline="fused")
    assert found.stage == "none" and found.failure == "" and "agrees" in str(found)


def test_expected_values_can_be_the_reference():
    bug = PASS_BUGS["expand_matmul_of_sum_out_dtype"]
    inputs = bug.inputs()
    found = blame(bug.build(), inputs, pipeline=bug.pipeline(), reference={"gv": bug.expected(inputs)[0]})
    assert (found.stage, found.pass_name) == ("pass", "ExpandMatmulOfSum")


def test_ddmin_keeps_a_one_minimal_ordered_subsequence():
    calls = []

    def fails(items):
        calls.append(list(items))
        return 3 in items and 7 in items and items.index(3) < items.index(7)

    assert ddmin(list(range(10)), fails) == [3, 7]  # (blame's passes: the steps a compile failure needs)
    assert all(c == sorted(c) for c in calls)  # order is kept


def test_blame_cli_says_the_importer_is_at_fault(tmp_path):
    """tvm-probe blame CONFIG -o DIR on an ONNX model whose wrong value is the importer's: no
    repro folder (no pass is blamed), exit 1 (a divergence), the evidence printed."""
    import onnx

    model, inputs = BUGS["maxpool_same_lower"].build()
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "in.npz", **inputs)
    (tmp_path / "c.yaml").write_text("model: {onnx: m.onnx}\ninputs: {x: {file: in.npz}}\n")
    done = subprocess.run([sys.executable, "-m", "tvm_probe", "blame", "c.yaml", "-o", "out"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "blame: importer — wrong value of bug/maxpool" in done.stdout
    assert "the importer already wrote another shape" in done.stdout
    assert not (tmp_path / "out").exists()


def test_blame_takes_a_torch_module_with_example_inputs():
    """Eager PyTorch is the reference: sqrt of negative numbers is NaN there, and TVM's Relu kernel
    (max(x, 0)) turns it into 0 — the op's kernel, as for the ONNX Relu bug (apache/tvm#19572)."""
    import torch

    class SqrtRelu(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(6, 6)

        def forward(self, x):
            return torch.tanh(torch.relu(torch.sqrt(self.fc(x))))

    torch.manual_seed(0)
    x = torch.randn(2, 6)
    found = blame((SqrtRelu().eval(), (x,)), [x.numpy()])
    assert (found.stage, found.kernel, found.value) == ("kernel", "relax.nn.relu", "relu"), str(found)


def test_a_kernel_that_kills_the_process_is_blamed_and_this_process_goes_on():
    """An ONNX Gather with an index far past its table: TVM's take kernel reads out of bounds and
    dies of SIGSEGV (tests/support/crash_models.py); blame runs the model in a watched child first."""
    from support.crash_models import crashing_gather

    found = blame(crashing_gather(), {"x": np.random.default_rng(0).standard_normal((4, 8)).astype("float32")})
    assert (found.stage, found.failure) == ("runtime-crash", "crash"), str(found)
    assert found.kernel.startswith("take") and "'gather_node' (Gather)" in str(found) and "SIGSEGV" in str(found)
