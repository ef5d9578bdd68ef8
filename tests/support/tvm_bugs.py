"""Real bugs of apache-tvm 0.27, each embedded in a bigger ONNX model: test cases for ``reduce``.

Every function returns ``(model, inputs)``.  The bug sits in the middle of unrelated work — a
few ops before it (which also make the NaN the bug mishandles, where it needs one), a few after
it, and a side branch to a second output — so that reducing the model has something to remove.
The nodes the bug itself needs are named ``bug/...``; :data:`BUGS` lists them per case.

Each case was checked to misbehave in apache-tvm 0.27.0.post1 (llvm, both the default and the
fused pipeline) against onnxruntime 1.32 before it was written down; a case that stops
misbehaving after an upgrade makes its test fail with "nothing to reduce", which is the signal
to drop it.  Cases checked and dropped: a runtime negative ``starts`` of Slice (#20263) gives
the right values in 0.27.

Not a library module: tests import it as ``support.tvm_bugs`` (see ``support/__init__.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 18
FLOAT = TensorProto.FLOAT


class _Builder:
    """A graph under construction: named nodes, initializers, inputs and outputs."""

    def __init__(self):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []

    def input(self, name: str, shape, elem=FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def const(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, name: str, inputs: list[str], **attrs) -> str:
        """Append node ``name``; its single output is the tensor ``name + ':0'``."""
        out = f"{name}:0"
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def output(self, tensor: str, shape, elem=FLOAT) -> None:
        self.outputs.append(helper.make_tensor_value_info(tensor, elem, list(shape)))

    def model(self, name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, self.inputs, self.outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = 9
        onnx.checker.check_model(model, full_check=True)
        return model


def _prefix(b: _Builder, x: str) -> str:
    """Unrelated work before the bug: ``sqrt(2x - 1)``, NaN wherever ``x < 0.5`` (in onnxruntime
    and in TVM alike: the first wrong value is the bug's, not this one)."""
    b.const("two", np.float32(2.0))
    b.const("one", np.float32(1.0))
    scaled = b.node("Mul", "pre/scale", [x, "two"])
    shifted = b.node("Sub", "pre/shift", [scaled, "one"])
    return b.node("Sqrt", "pre/sqrt", [shifted])


def _suffix(b: _Builder, y: str, shape) -> None:
    """Unrelated work after the bug, to the model output ``out``."""
    b.const("three", np.float32(3.0))
    b.const("half", np.float32(0.5))
    scaled = b.node("Mul", "post/scale", [y, "three"])
    shifted = b.node("Add", "post/shift", [scaled, "half"])
    b.nodes.append(helper.make_node("Tanh", [shifted], ["out"], name="post/tanh"))
    b.output("out", shape)


def _side_branch(b: _Builder, x: str) -> None:
    """A branch that has nothing to do with the bug: ``sum(exp(x))`` to the output ``aux``."""
    e = b.node("Exp", "side/exp", [x])
    b.nodes.append(helper.make_node("ReduceSum", [e], ["aux"], name="side/sum", keepdims=0))
    b.output("aux", [])


def _nan_inputs(shape) -> dict[str, np.ndarray]:
    """``x`` in [-1, 2): about a third of ``sqrt(2x - 1)`` is NaN, at fixed positions."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1.0, 2.0, size=shape).astype(np.float32)
    x.flat[0], x.flat[1] = -0.5, 1.5  # at least one NaN and one number, whatever the seed gives
    return {"x": x}


def _unary_nan_case(op: str, name: str, **attrs):
    b = _Builder()
    x = b.input("x", [2, 6])
    y = b.node(op, f"bug/{name}", [_prefix(b, x)], **attrs)
    _suffix(b, y, [2, 6])
    _side_branch(b, x)
    return b.model(f"{name}_nan"), _nan_inputs((2, 6))


def relu_nan():
    """Relu(NaN) gives 0 instead of NaN — apache/tvm#19572 (also #19579: TVM's max/min compile
    to x86 maxps/minps, which return the second operand when the first is NaN)."""
    return _unary_nan_case("Relu", "relu")


def sign_nan():
    """Sign(NaN) gives 0 instead of NaN — apache/tvm#19543 (and #19572)."""
    return _unary_nan_case("Sign", "sign")


def hardsigmoid_nan():
    """HardSigmoid(NaN) gives 1 instead of NaN — apache/tvm#17999."""
    return _unary_nan_case("HardSigmoid", "hardsigmoid", alpha=0.2, beta=0.5)


def clip_nan():
    """Clip(NaN, 0, 6) gives the lower bound 0 instead of NaN — apache/tvm#19579 (Clip lowers to
    max/min, which drop a NaN first operand; #19533 is the NaN-bound side of the same op)."""
    b = _Builder()
    x = b.input("x", [2, 6])
    lo, hi = b.const("clip_lo", np.float32(0.0)), b.const("clip_hi", np.float32(6.0))
    y = b.node("Clip", "bug/clip", [_prefix(b, x), lo, hi])
    _suffix(b, y, [2, 6])
    _side_branch(b, x)
    return b.model("clip_nan"), _nan_inputs((2, 6))


def min_nan():
    """Min(NaN, v) gives v instead of NaN — apache/tvm#19540."""
    b = _Builder()
    x = b.input("x", [2, 6])
    b.const("quarter", np.float32(0.25))
    other = b.node("Mul", "pre/other", [x, "quarter"])
    y = b.node("Min", "bug/min", [_prefix(b, x), other])
    _suffix(b, y, [2, 6])
    _side_branch(b, x)
    return b.model("min_nan"), _nan_inputs((2, 6))


def reducemax_nan():
    """ReduceMax of rows holding NaN depends on where the NaN is: TVM ignores a NaN that comes
    first and keeps one that comes last — apache/tvm#19572.  (onnxruntime 1.32 is not
    consistent either: NaN for a leading NaN, the other values' max for a trailing one; the
    rows here disagree both ways.)"""
    b = _Builder()
    x = b.input("x", [4, 3])
    axes = b.const("max_axes", np.array([1], dtype=np.int64))
    y = b.node("ReduceMax", "bug/reducemax", [_prefix(b, x), axes], keepdims=1)
    _suffix(b, y, [4, 1])
    _side_branch(b, x)
    x_value = np.array([[-0.5, 1.5, 2.0], [1.5, 2.0, -0.5], [1.0, 0.75, 1.25], [-1.0, -0.25, 1.75]],
                       dtype=np.float32)
    return b.model("reducemax_nan"), {"x": x_value}


def resize_half_pixel():
    """Resize (nearest, half_pixel) with a fractional scale (2.5) samples the wrong source
    pixels: TVM derives the scale from the rounded output size — apache/tvm#19570."""
    b = _Builder()
    x = b.input("x", [1, 1, 3, 3])
    b.const("bias", np.float32(1.0))
    b.const("gain", np.float32(2.0))
    shifted = b.node("Add", "pre/bias", [x, "bias"])
    scaled = b.node("Mul", "pre/gain", [shifted, "gain"])
    roi = b.const("resize_roi", np.zeros(0, dtype=np.float32))
    scales = b.const("resize_scales", np.array([1, 1, 2.5, 2.5], dtype=np.float32))
    y = b.node("Resize", "bug/resize", [scaled, roi, scales], mode="nearest",
               coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_floor")
    _suffix(b, y, [1, 1, 7, 7])
    _side_branch(b, x)
    return b.model("resize_half_pixel"), {"x": np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3) / 4}


def _maxpool_prefix(b: _Builder):
    x = b.input("x", [1, 1, 5, 5])
    b.const("gain", np.float32(2.0))
    b.const("bias", np.float32(-1.0))
    scaled = b.node("Mul", "pre/gain", [x, "gain"])
    shifted = b.node("Add", "pre/bias", [scaled, "bias"])
    pooled = b.node("MaxPool", "bug/maxpool", [shifted], kernel_shape=[3, 3], strides=[2, 2],
                    auto_pad="SAME_LOWER")
    return x, pooled


def _maxpool_inputs():
    return {"x": np.random.default_rng(1).standard_normal((1, 1, 5, 5)).astype(np.float32)}


def maxpool_same_lower():
    """MaxPool with auto_pad=SAME_LOWER and stride 2 on a 5x5 input gives a 2x2 output instead
    of 3x3: the converter computes the output extent with floor(in / stride), the spec says
    ceil — described and fixed in apache/tvm PR #20404."""
    b = _Builder()
    x, pooled = _maxpool_prefix(b)
    _suffix(b, pooled, [1, 1, 3, 3])
    _side_branch(b, x)
    return b.model("maxpool_same_lower"), _maxpool_inputs()


def maxpool_same_lower_then_reshape():
    """The MaxPool SAME_LOWER shape bug (PR #20404) followed by a Reshape of the 9 values the
    spec promises: TVM's importer then fails ("Reshape expects the new shape to be convertible
    from the old shape"), a compile failure that needs both nodes."""
    b = _Builder()
    x, pooled = _maxpool_prefix(b)
    shape = b.const("flat_shape", np.array([1, 9], dtype=np.int64))
    flat = b.node("Reshape", "bug/flatten", [pooled, shape])
    _suffix(b, flat, [1, 9])
    _side_branch(b, x)
    return b.model("maxpool_same_lower_reshape"), _maxpool_inputs()


def slice_empty_negative_step():
    """Slice with starts=0, ends=5, steps=-1 is empty in ONNX; TVM fails to compile it (TOPI's
    strided_slice check "Input [Begin=0, End=5] is invalid for axis=0") — apache/tvm#19532."""
    b = _Builder()
    x = b.input("x", [10])
    b.const("gain", np.float32(2.0))
    scaled = b.node("Mul", "pre/gain", [x, "gain"])
    starts, ends = b.const("slice_starts", np.array([0])), b.const("slice_ends", np.array([5]))
    axes, steps = b.const("slice_axes", np.array([0])), b.const("slice_steps", np.array([-1]))
    empty = b.node("Slice", "bug/slice", [scaled, starts, ends, axes, steps])
    joined = b.node("Concat", "post/concat", [empty, x], axis=0)
    _suffix(b, joined, [10])
    _side_branch(b, x)
    return b.model("slice_empty_negative_step"), {"x": np.linspace(-1, 1, 10, dtype=np.float32)}


@dataclass(frozen=True)
class Bug:
    """One case: how to build it, its upstream reference, and what the reduction must leave."""

    build: Callable
    upstream: str
    kind: str                     # "divergence" or "compile"
    nodes: tuple[str, ...]        # the node names a minimal reproduction keeps
    op: str                       # the op type at fault (a divergence is reported at its output)


BUGS = {
    "relu_nan": Bug(relu_nan, "apache/tvm#19572", "divergence", ("bug/relu",), "Relu"),
    "sign_nan": Bug(sign_nan, "apache/tvm#19543", "divergence", ("bug/sign",), "Sign"),
    "hardsigmoid_nan": Bug(hardsigmoid_nan, "apache/tvm#17999", "divergence", ("bug/hardsigmoid",), "HardSigmoid"),
    "clip_nan": Bug(clip_nan, "apache/tvm#19579", "divergence", ("bug/clip",), "Clip"),
    "min_nan": Bug(min_nan, "apache/tvm#19540", "divergence", ("bug/min",), "Min"),
    "reducemax_nan": Bug(reducemax_nan, "apache/tvm#19572", "divergence", ("bug/reducemax",), "ReduceMax"),
    "resize_half_pixel": Bug(resize_half_pixel, "apache/tvm#19570", "divergence", ("bug/resize",), "Resize"),
    "maxpool_same_lower": Bug(maxpool_same_lower, "apache/tvm#20404", "divergence", ("bug/maxpool",), "MaxPool"),
    "maxpool_same_lower_then_reshape": Bug(maxpool_same_lower_then_reshape, "apache/tvm#20404", "compile",
                                           ("bug/maxpool", "bug/flatten"), "Reshape"),
    "slice_empty_negative_step": Bug(slice_empty_negative_step, "apache/tvm#19532", "compile",
                                     ("bug/slice",), "Slice"),
}
