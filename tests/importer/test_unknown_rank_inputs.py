"""ONNX inputs declared without a rank are compiled as TVM compiles them; ``shapes=`` stays an option.

TVM's importer gives such an input ``R.Tensor(ndim=-1)``; plain TVM builds and runs a model whose
kernels do not need the rank (a ``Reshape`` to a constant shape, then anything), and cannot build
one that does (a ``Relu`` of unknown rank).  tvm_probe runs what plain TVM runs, with the same
values, and where TVM cannot build says so naming the op, pointing to ``shapes=``.
"""
from __future__ import annotations

import numpy as np
import pytest

from support.campaign import onnx_plain, run_case
from support.campaign_onnx import extra_cases
from tvm_probe import InputError, ModelError, Probe, TVMCompileError
from tvm_probe.core.schema import PIPELINES

CASES = {c.name.rsplit("/", 1)[1]: c for c in extra_cases() if c.cls == "unknown rank"}


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_reshape_of_an_input_of_unknown_rank_runs_as_plain_tvm_runs_it(pipeline):
    case = CASES["unknown_rank_reshape_relu"]
    outcome = run_case(case, pipeline)
    if pipeline == "fused":  # TVM's fused pipeline cannot build it ("emit_te ... ShapeExpr shape")
        assert "ShapeExpr" in outcome.plain
        with pytest.raises(TVMCompileError, match=r"at source op 'r' \(Reshape\): emit_te .*pass shapes="):
            Probe.from_onnx(case.make()[0], pipeline=pipeline)
        return
    assert outcome.plain == "" and outcome.problems == [] and outcome.compared == outcome.equal == 2


def test_any_rank_is_fed_and_named_in_messages():
    model, inputs = CASES["unknown_rank_reshape_relu"].make()
    probe = Probe.from_onnx(model)
    assert probe.inputs[0].shape is None
    x = np.arange(6, dtype=np.float32)  # another rank, the same six elements
    np.testing.assert_array_equal(probe.run({"x": x})["y"], np.maximum(x.reshape(3, 2), 0))
    np.testing.assert_array_equal(probe.get("r"), x.reshape(3, 2))
    np.testing.assert_array_equal(probe.run(inputs)["y"], onnx_plain(model, inputs, "default")[0])
    with pytest.raises(InputError, match=r"^input 'x' has dtype float64, the model expects float32"):
        probe.run({"x": x.astype(np.float64)})


def test_an_identity_of_unknown_rank_serves_its_input():
    outcome = run_case(CASES["unknown_rank_identity"], "default")
    assert outcome.plain == "" and outcome.problems == []


def test_shapes_still_pins_an_input_of_unknown_rank():
    model, _ = CASES["unknown_rank_relu"].make()
    with pytest.raises(ModelError, match=r"R.nn.relu of R.Tensor\(ndim=-1\).*pass shapes=\{'x'"):
        Probe.from_onnx(model)
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    probe = Probe.from_onnx(model, shapes={"x": (2, 4)})
    assert probe.inputs[0].shape == (2, 4)
    np.testing.assert_array_equal(probe.run({"x": x})["y"], np.maximum(x, 0))


def test_a_random_input_of_unknown_rank_needs_its_shape_in_the_config():
    from tvm_probe.app.config import ConfigError, InputSource

    model, _ = CASES["unknown_rank_reshape_relu"].make()
    spec = Probe.from_onnx(model).inputs[0]
    with pytest.raises(ConfigError, match=r"^inputs.x: the model declares it with no rank: give 'x: \{random: "
                                          r"\{shape: \[...\]\}\}' or a file$"):
        InputSource(name="x", random={}).load(spec)
    assert InputSource(name="x", random={"shape": [6]}).load(spec).shape == (6,)
