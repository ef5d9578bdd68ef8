"""Real TVM 0.27 bugs (tests/support/tvm_bugs.py) seen through tvm_probe: the verdict names the truly
first wrong node, compile failures are TVM failures (exit 4), and `tvm-probe reduce` writes the
reproduction from a config."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from support.tvm_bugs import BUGS
from tvm_probe import Probe, TVMError
from tvm_probe.app.cli import main
from tvm_probe.comparison.verdict import compare
from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values

DIVERGENCES = sorted(name for name, bug in BUGS.items() if bug.kind == "divergence")
COMPILE_FAILURES = sorted(name for name, bug in BUGS.items() if bug.kind == "compile")


@pytest.mark.parametrize("name", DIVERGENCES)
def test_the_first_divergent_op_is_the_bug(name):
    """Ops before the bug (and a side branch) agree, the bug's op is named first — not the op that
    correctly produced a NaN the buggy op then drops."""
    model, inputs = BUGS[name].build()
    probe = Probe.from_onnx(model)
    probe.run(inputs, allow_nonfinite=True)
    result = compare(probe, onnxruntime_values(model, inputs))
    assert not result
    assert result.first_divergent.name in BUGS[name].nodes, result.verdict()
    assert result.verdict().startswith("FAIL: ") and not result.unchecked


@pytest.mark.parametrize("name", COMPILE_FAILURES)
def test_a_model_tvm_cannot_build_is_a_tvm_failure(name):
    model, _ = BUGS[name].build()
    with pytest.raises(TVMError) as err:
        Probe.from_onnx(model)
    message = str(err.value)
    assert "\n" not in message
    # one line that names where, in source terms: a node the bug needs, and TVM's own words
    assert any(f"'{node}'" in message for node in BUGS[name].nodes), message
    assert "failed" in message and len(message) < 600, message


def test_reduce_from_a_config_through_the_cli(tmp_path, capsys):
    model, inputs = BUGS["relu_nan"].build()
    onnx.save(model, tmp_path / "m.onnx")
    np.savez(tmp_path / "x.npz", **inputs)
    config = tmp_path / "c.yaml"
    config.write_text("model: {onnx: m.onnx}\n"
                      "inputs:\n" + "".join(f"  {k}: {{file: x.npz, key: {k}}}\n" for k in inputs))
    assert main(["-q", "reduce", str(config), "-o", str(tmp_path / "repro")]) == 0
    out = capsys.readouterr().out
    assert "to 1 (Relu 'bug/relu')" in out
    assert sorted(p.name for p in (tmp_path / "repro").iterdir()) == sorted(
        ["model.onnx", "inputs.npz", "expected.npz", "repro.py", "README.md"])
    assert [n.name for n in onnx.load(tmp_path / "repro" / "model.onnx").graph.node] == ["bug/relu"]
