"""The ground truth ``blame`` is tested against (tests/support/bug_stages.py): each real TVM 0.27 bug
of tests/support/tvm_bugs.py is put on a stage — importer, pass or kernel — and the experiments
behind that, re-run here with plain TVM, numpy and onnxruntime, must still support it.

If TVM is upgraded and a bug is fixed or moves, these fail: re-run the experiment
(``support.bug_stages.experiment(name)``), update ``STAGES`` and ``bug_stages.md``.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from support.bug_stages import ONNX_WITNESS, STAGES, Stage, experiment
from support.tvm_bugs import BUGS

DIVERGENCES = sorted(name for name, bug in BUGS.items() if bug.kind == "divergence")
NAN_BUGS = ["relu_nan", "sign_nan", "hardsigmoid_nan", "clip_nan", "min_nan"]


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and np.allclose(a, b, rtol=1e-6, atol=1e-6, equal_nan=True)


def _verdict(obs: dict, witness: str) -> str:
    """The decision rule of bug_stages.py's docstring, on one divergence's observations."""
    faithful = _same(obs["relax_meaning"], obs[witness])          # importer's Relax means the ONNX node
    kernel_right = _same(obs["kernel"], obs["relax_meaning"])      # TVM computes what the Relax op means
    if not faithful and kernel_right:
        return "importer"
    if faithful and not kernel_right:
        return "pass" if _same(obs["kernel_default_build"], obs["relax_meaning"]) else "kernel"
    return f"undecided (faithful={faithful}, kernel_right={kernel_right})"


def _is_nan_only(values) -> bool:
    return len(values) == 1 and math.isnan(values[0])


# ------------------------------------------------------------------ the table itself
def test_every_bug_has_a_stage():
    assert set(STAGES) == set(BUGS)
    for name, stage in STAGES.items():
        assert isinstance(stage, Stage) and stage.stage in ("importer", "pass", "kernel"), name
        assert (stage.pass_name is None) == (stage.stage != "pass"), name
        assert stage.evidence.strip(), name


# ------------------------------------------------------------------ divergences: the decision rule
@pytest.mark.parametrize("name", DIVERGENCES)
def test_divergence_observations_decide_the_stage(name):
    obs = experiment(name)
    witness = ONNX_WITNESS.get(name, "onnxruntime")
    assert _verdict(obs, witness) == STAGES[name].stage
    # the bug is there: what TVM computes for the imported nodes is not what ONNX says
    assert not _same(obs["imported_tvm"], obs[witness])
    # and the imported module compiles to exactly what the hand-written Relax ops compile to
    if STAGES[name].stage == "kernel":
        assert _same(obs["imported_tvm"], obs["kernel"])


@pytest.mark.parametrize("name", [n for n in DIVERGENCES if STAGES[n].stage == "kernel"])
def test_no_optimising_pass_is_needed_for_a_kernel_bug(name):
    """``default_build`` (LegalizeOps + mandatory lowering, no optimising pass) is as wrong as
    ``default``: the value is already wrong in the legalized PrimFunc."""
    obs = experiment(name)
    assert _same(obs["kernel_default_build"], obs["kernel"])
    assert not _same(obs["kernel_default_build"], obs["relax_meaning"])


# ------------------------------------------------------------------ NaN kernels, one by one
@pytest.mark.parametrize("name", NAN_BUGS)
def test_nan_bugs_import_faithfully_and_the_kernel_drops_the_nan(name):
    obs = experiment(name)
    assert obs["relax_shape"] == obs["onnx_shape"]
    assert _is_nan_only(obs["onnxruntime_on_nan"]) and _is_nan_only(obs["onnx_reference_on_nan"])
    assert _is_nan_only(obs["relax_meaning_on_nan"])
    assert not any(math.isnan(v) for v in obs["kernel_on_nan"])
    assert obs["imported_tvm_on_nan"] == obs["kernel_on_nan"]


def test_relu_kernel_is_t_max_x_0():
    obs = experiment("relu_nan")
    assert obs["relax_ops"] == ("relax.nn.relu",)
    assert obs["kernel_on_nan"] == (0.0,)
    assert len(obs["tir"]) == 1 and "T.max(x[" in obs["tir"][0] and "T.float32(0.0))" in obs["tir"][0]
    # TIR's max is an ordered compare + select in LLVM: a NaN survives only as the second operand
    order = obs["tir_max_order"]
    assert order["T.max(nan, 0)"] == 0.0 and math.isnan(order["T.max(0, nan)"])
    assert order["llvm_ir_has_fcmp_ogt_select"]


def test_sign_kernel_is_two_selects():
    obs = experiment("sign_nan")
    assert obs["relax_ops"] == ("relax.sign",)
    assert obs["kernel_on_nan"] == (0.0,)
    assert len(obs["tir"]) == 1 and obs["tir"][0].count("T.Select(") == 2


def test_hardsigmoid_imports_to_clip_whose_kernel_gives_1():
    obs = experiment("hardsigmoid_nan")
    assert obs["relax_ops"] == ("relax.multiply", "relax.add", "relax.clip")
    assert obs["kernel_on_nan"] == (1.0,)
    assert any("T.max(T.min(" in line and "T.float32(1.0)" in line for line in obs["tir"])


def test_clip_importer_writes_topi_max_min_and_t_max_drops_nan():
    obs = experiment("clip_nan")
    assert "relax.call_tir:maximum" in obs["relax_ops"] and "relax.call_tir:minimum" in obs["relax_ops"]
    assert any("= T.max(" in line for line in obs["imported_tir"])
    assert obs["kernel_on_nan"] == (0.0,)          # R.minimum(R.maximum(x, 0), 6): the lower bound
    assert obs["relax_clip_on_nan"] == (6.0,)      # R.clip(x, 0, 6) is wrong too: the upper bound


def test_min_imports_to_stack_min_whose_reduction_returns_the_other_operand():
    obs = experiment("min_nan")
    assert obs["relax_ops"][-2:] == ("relax.stack", "relax.min")
    assert obs["kernel_equals_other_operand_on_nan"]
    assert obs["relax_minimum_on_nan"] == obs["kernel_on_nan"]     # R.minimum(a, b) alike
    assert any("T.min(" in line for line in obs["tir"])


def test_reducemax_kernel_ignores_a_leading_nan_and_keeps_a_trailing_one():
    obs = experiment("reducemax_nan")
    assert obs["relax_ops"] == ("relax.max",)
    assert any("T.max(x_red" in line for line in obs["tir"])
    kernel = obs["kernel"].ravel()
    for has_nan, leading, value in zip(obs["nan_rows"], obs["leading_nan_rows"], kernel):
        if has_nan:
            assert math.isnan(value) != leading, (leading, value)
    # the ambiguity: onnxruntime itself keeps a leading NaN and drops a trailing one
    ort = obs["onnxruntime"].ravel()
    for has_nan, leading, value in zip(obs["nan_rows"], obs["leading_nan_rows"], ort):
        if has_nan:
            assert math.isnan(value) == leading
    assert all(math.isnan(v) for v, has in zip(obs["onnx_reference"].ravel(), obs["nan_rows"]) if has)


# ------------------------------------------------------------------ importer divergences
def test_resize_importer_drops_the_scale():
    obs = experiment("resize_half_pixel")
    assert obs["relax_ops"] == ("relax.image.resize2d",)
    assert obs["resize_size"] == (7, 7)
    assert obs["relax_shape"] == obs["onnx_shape"] == (1, 1, 7, 7)   # same shape, other pixels
    # ONNX asked for size 7 (scale 7/3) computes what TVM computes; ONNX asked for scale 2.5 does not
    assert _same(obs["onnxruntime_with_sizes_7"], obs["kernel"])
    assert not _same(obs["onnxruntime_with_sizes_7"], obs["onnxruntime"])
    assert _same(obs["onnx_reference"], obs["onnxruntime"])


def test_maxpool_importer_pads_nothing():
    obs = experiment("maxpool_same_lower")
    assert obs["relax_ops"] == ("relax.nn.max_pool2d",)
    assert obs["padding"] == (0, 0, 0, 0)
    assert obs["relax_shape"] == (1, 1, 2, 2)
    assert obs["onnx_shape"] == obs["onnx_inferred_shape"] == (1, 1, 3, 3)
    # the op can say it: with SAME_LOWER's padding, TVM's kernel gives onnxruntime's values
    assert _same(obs["kernel_with_same_lower_padding"], obs["onnxruntime"])


# ------------------------------------------------------------------ compile failures
def test_maxpool_then_reshape_fails_inside_from_onnx_because_of_maxpool():
    obs = experiment("maxpool_same_lower_then_reshape")
    assert STAGES["maxpool_same_lower_then_reshape"].stage == "importer"
    for key in ("whole", "nodes"):
        assert "Reshape expects the new shape to be convertible" in obs[f"{key}_from_onnx_error"]
        assert obs[f"{key}_raised_under"] == ("from_onnx",)
        assert "InferTypeReshape" in obs[f"{key}_raised_in"]
    assert obs["maxpool_relax_shape"] == (1, 1, 2, 2) and obs["maxpool_onnx_shape"] == (1, 1, 3, 3)
    # Reshape's own translation is right: alone, on the spec's 3x3, it imports, builds and agrees
    assert obs["reshape_alone_relax_ops"] == ("relax.reshape",)
    assert _same(obs["reshape_alone_tvm"], obs["reshape_alone_onnxruntime"])


def test_slice_imports_faithfully_and_fails_in_legalize_ops():
    obs = experiment("slice_empty_negative_step")
    assert STAGES["slice_empty_negative_step"].stage == "kernel"
    assert obs["relax_ops"] == ("relax.strided_slice",)
    assert obs["slice_args"] == ((0,), (0,), (5,), (-1,))            # axes, begin, end, strides
    assert obs["onnx_shape"] == obs["onnx_reference_shape"] == obs["numpy_shape"] == (0,)
    assert obs["relax_meaning_shape"] == (0,)
    # the op's own shape inference is wrong, with or without the importer
    assert obs["relax_shape"] == obs["kernel_relax_shape"] == (-5,)
    for key in ("imported_build", "kernel_build"):
        assert obs[key]["failed"] and obs[key]["failing_pass"] == "LegalizeOps"
        assert "Input [Begin=0, End=5] is invalid for axis=0" in obs[key]["error"]
    assert "Input [Begin=0, End=5] is invalid for axis=0" in obs["legalize_ops_error"]
    assert "Input [Begin=0, End=5] is invalid for axis=0" in obs["topi_error"]
