"""ONNX cases of the op campaign (:mod:`support.campaign`).

Every node test ONNX ships (``onnx.backend.test.case.node``: one model per op and attribute
combination, with its inputs, written by ONNX's authors) whose ops TVM 0.27's ONNX frontend
converts; each also as ``@const`` where it takes integer operands as inputs (they become
initializers, as exporters write them), and as ``@dyn``, every input dimension symbolic (named
by its size, so that dimensions of one size stay equal, as a batch axis shared by inputs does).  Then models for what
those leave out: the converted ops ONNX has no node test for (contrib ops, sequences), inputs of
unknown rank, ops with axes given as inputs, shape arithmetic, several outputs on symbolic shapes.
"""
from __future__ import annotations

import functools
import warnings

import numpy as np
import onnx
from onnx import TensorProto, helper

from .campaign import Case

OPSET = 17


@functools.lru_cache(maxsize=1)
def converted_ops() -> frozenset:
    """The op types TVM 0.27's ONNX frontend converts (its converter table, and ``If``, which it
    converts itself)."""
    from tvm.relax.frontend.onnx import onnx_frontend

    return frozenset(onnx_frontend._get_convert_map()) | {"If"}


@functools.lru_cache(maxsize=1)
def _node_tests() -> tuple:
    from onnx.backend.test.case import node

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return tuple(node.collect_testcases(None))


def _tensor_inputs(model, arrays) -> dict | None:
    graph = model.graph
    if len(arrays) != len(graph.input) or not all(isinstance(a, np.ndarray) for a in arrays):
        return None  # sequences, optionals: no plain tensor feed
    if not all(i.type.HasField("tensor_type") for i in graph.input):
        return None
    return {i.name: a for i, a in zip(graph.input, arrays)}


def _converted(model) -> bool:
    ops = converted_ops()
    return all(n.op_type in ops and n.domain in ("", "ai.onnx") for n in model.graph.node)


def dynamic(model) -> onnx.ModelProto | None:
    """``model`` with every input dimension symbolic (``n<size>``) and no shapes on outputs or
    value_info; None when no input has a dimension."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    changed = False
    for vi in m.graph.input:
        for dim in vi.type.tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                dim.dim_param = f"n{dim.dim_value}"
                changed = True
    if not changed:
        return None
    del m.graph.value_info[:]
    for vi in m.graph.output:
        ty = vi.type.sequence_type.elem_type if vi.type.HasField("sequence_type") else vi.type
        ty.tensor_type.ClearField("shape")  # (a sequence keeps its type: onnxruntime needs it)
    return m


def constant_operands(model, inputs: dict):
    """``model`` with every integer input after the first made an initializer of its test value
    (split sizes, axes, ``k``, pads, shapes: what exporters write as constants and TVM needs
    as such), and the inputs left; None when there is none to make constant."""
    graph = model.graph
    fold = [i.name for i in graph.input[1:]
            if i.type.tensor_type.elem_type in (TensorProto.INT64, TensorProto.INT32)]
    if not fold:
        return None
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [i for i in m.graph.input if i.name not in fold]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    m.graph.initializer.extend(onnx.numpy_helper.from_array(inputs[n], n) for n in fold)
    return m, {k: v for k, v in inputs.items() if k not in fold}


def _node_cases(test) -> list[Case]:
    """The node test as ONNX wrote it, ``@const`` (:func:`constant_operands`) and ``@dyn`` (every
    input dimension symbolic, of the ``@const`` model where there is one)."""
    arrays = test.data_sets[0][0] if test.data_sets else None
    if arrays is None or test.model is None or not _converted(test.model):
        return []
    inputs = _tensor_inputs(test.model, list(arrays))
    if inputs is None:
        return []
    op = test.model.graph.node[0].op_type if len(test.model.graph.node) == 1 else _main_op(test.name)
    variants = [("", test.model, inputs)]
    const = constant_operands(test.model, inputs)
    if const is not None:
        variants.append(("@const", *const))
    base_model, base_inputs = variants[-1][1:]
    dyn = dynamic(base_model)
    if dyn is not None:
        variants.append(("@dyn", dyn, base_inputs))
    return [Case(f"onnx/{test.name}{tag}", "onnx", op, lambda m=m, i=i: (m, i)) for tag, m, i in variants]


def _main_op(name: str) -> str:
    """The op a multi-node node test is about, from its name (``test_layer_normalization_…``)."""
    words = name.removeprefix("test_").split("_")
    ops = {o.lower(): o for o in converted_ops()}
    for n in range(len(words), 0, -1):
        joined = "".join(words[:n])
        if joined in ops:
            return ops[joined]
    return "(expanded)"


def onnx_cases() -> list[Case]:
    """Every ONNX case: the node tests (as written, ``@const``, ``@dyn``) and :func:`extra_cases`."""
    return [c for test in _node_tests() for c in _node_cases(test)] + extra_cases()


# -- models the node tests leave out ------------------------------------------------------------
def _model(nodes, inputs, outputs, inits=(), opset=OPSET, ms=False) -> onnx.ModelProto:
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if ms else [])
    graph = helper.make_graph(nodes, "campaign", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _out(*names):
    return [helper.make_empty_tensor_value_info(n) for n in names]


def _rng(seed=0):
    return np.random.default_rng(seed)


def _f32(*shape, seed=0):
    return _rng(seed).standard_normal(shape).astype(np.float32)


def _extra(name, cls, make):
    return Case(f"onnx/extra/{name}", "onnx", cls, make)


def extra_cases() -> list[Case]:
    x23 = _f32(2, 3)
    init = lambda n, a: onnx.numpy_helper.from_array(np.asarray(a), n)  # noqa: E731
    cases = [
        # inputs of unknown rank: TVM compiles them as given (where it can: not under a kernel of
        # unknown rank, which plain TVM cannot build either)
        _extra("unknown_rank_identity", "unknown rank", lambda: (_model(
            [helper.make_node("Identity", ["x"], ["y"])], [_vi("x", None)], _out("y")), {"x": x23})),
        _extra("unknown_rank_reshape_relu", "unknown rank", lambda: (_model(
            [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Relu", ["r"], ["y"])],
            [_vi("x", None)], _out("y"), [init("s", np.array([3, 2], np.int64))]), {"x": x23})),
        _extra("unknown_rank_shape", "unknown rank", lambda: (_model(
            [helper.make_node("Shape", ["x"], ["y"])], [_vi("x", None)], _out("y")), {"x": x23})),
        _extra("unknown_rank_relu", "unknown rank", lambda: (_model(
            [helper.make_node("Relu", ["x"], ["y"])], [_vi("x", None)], _out("y")), {"x": x23})),
        # axes as inputs on symbolic shapes
        _extra("unsqueeze_axes_input_dyn", "Unsqueeze", lambda: (_model(
            [helper.make_node("Unsqueeze", ["x", "axes"], ["y"])],
            [_vi("x", ["a", "b"]), _vi("axes", [1], TensorProto.INT64)], _out("y"), opset=13),
            {"x": x23, "axes": np.array([1], np.int64)})),
        _extra("unsqueeze_axes_const_dyn", "Unsqueeze", lambda: (_model(
            [helper.make_node("Unsqueeze", ["x", "axes"], ["u"]), helper.make_node("Relu", ["u"], ["y"])],
            [_vi("x", ["a", "b"])], _out("y"), [init("axes", np.array([0, 3], np.int64))], opset=13),
            {"x": x23})),
        # shape arithmetic: the target shape computed from the input's
        _extra("shape_gather_concat_reshape_dyn", "shape arithmetic", lambda: (_model([
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
            helper.make_node("Unsqueeze", ["d0", "ax"], ["d0u"]),
            helper.make_node("Concat", ["d0u", "m1"], ["t"], axis=0),
            helper.make_node("Reshape", ["x", "t"], ["r"]),
            helper.make_node("Tanh", ["r"], ["y"])],
            [_vi("x", ["a", "b", "c"])], _out("y"),
            [init("i0", np.array(0, np.int64)), init("ax", np.array([0], np.int64)),
             init("m1", np.array([-1], np.int64))], opset=13), {"x": _f32(2, 3, 4)})),
        _extra("expand_to_shape_of_dyn", "shape arithmetic", lambda: (_model([
            helper.make_node("Shape", ["y"], ["s"]),
            helper.make_node("Expand", ["x", "s"], ["e"]),
            helper.make_node("Add", ["e", "y"], ["z"])],
            [_vi("x", [1, "b"]), _vi("y", ["a", "b"])], _out("z")), {"x": _f32(1, 3), "y": x23})),
        # several outputs on symbolic shapes
        _extra("split3_dyn", "Split", lambda: (_model(
            [helper.make_node("Split", ["x"], ["p", "q", "r"], axis=0, num_outputs=3),
             helper.make_node("Add", ["p", "q"], ["s"]), helper.make_node("Mul", ["s", "r"], ["y"])],
            [_vi("x", ["n", 4])], _out("y"), opset=18), {"x": _f32(6, 4)})),
        _extra("topk_dyn_values_only", "TopK", lambda: (_model(
            [helper.make_node("TopK", ["x", "k"], ["v", ""], axis=1), helper.make_node("Neg", ["v"], ["y"])],
            [_vi("x", ["a", "b"])], _out("y"), [init("k", np.array([2], np.int64))]), {"x": _f32(3, 5)})),
        _extra("maxpool_indices_dyn", "MaxPool", lambda: (_model(
            [helper.make_node("MaxPool", ["x"], ["v", "i"], kernel_shape=[2, 2], strides=[2, 2])],
            [_vi("x", ["n", 2, 4, 4])], _out("v", "i")), {"x": _f32(1, 2, 4, 4)})),
        # sequences
        _extra("sequence_construct_at", "SequenceAt", lambda: (_model(
            [helper.make_node("SequenceConstruct", ["x", "y"], ["s"]),
             helper.make_node("SequenceAt", ["s", "i"], ["a"]), helper.make_node("Relu", ["a"], ["o"])],
            [_vi("x", [2, 3]), _vi("y", [2, 3])], _out("o"), [init("i", np.array(1, np.int64))]),
            {"x": x23, "y": _f32(2, 3, seed=2)})),
        _extra("concat_from_sequence", "ConcatFromSequence", lambda: (_model(
            [helper.make_node("SequenceConstruct", ["x", "y"], ["s"]),
             helper.make_node("ConcatFromSequence", ["s"], ["c"], axis=1),
             helper.make_node("Exp", ["c"], ["o"])],
            [_vi("x", [2, 3]), _vi("y", [2, 3])], _out("o")), {"x": x23, "y": _f32(2, 3, seed=2)})),
        _extra("sequence_insert_erase_length", "SequenceInsert", lambda: (_model(
            [helper.make_node("SequenceEmpty", [], ["e"], dtype=TensorProto.FLOAT),
             helper.make_node("SequenceInsert", ["e", "x"], ["s1"]),
             helper.make_node("SequenceInsert", ["s1", "y"], ["s2"]),
             helper.make_node("SequenceErase", ["s2", "i"], ["s3"]),
             helper.make_node("SequenceAt", ["s3", "i"], ["a"]),
             helper.make_node("Sigmoid", ["a"], ["o"])],
            [_vi("x", [2, 3]), _vi("y", [2, 3])], _out("o"), [init("i", np.array(0, np.int64))]),
            {"x": x23, "y": _f32(2, 3, seed=2)})),
        # converted ops ONNX has no node test for
        _extra("global_lp_pool", "GlobalLpPool", lambda: (_model(
            [helper.make_node("GlobalLpPool", ["x"], ["y"], p=2)], [_vi("x", [1, 2, 3, 3])], _out("y")),
            {"x": _f32(1, 2, 3, 3)})),
        _extra("max_roi_pool", "MaxRoiPool", lambda: (_model(
            [helper.make_node("MaxRoiPool", ["x", "rois"], ["y"], pooled_shape=[2, 2], spatial_scale=1.0)],
            [_vi("x", [1, 2, 6, 6])], _out("y"), [init("rois", np.array([[0, 0, 0, 4, 4], [0, 1, 1, 5, 5]],
                                                                          np.float32))]),
            {"x": _f32(1, 2, 6, 6)})),
        _extra("fast_gelu", "FastGelu", lambda: (_model(
            [helper.make_node("FastGelu", ["x", "b"], ["y"], domain="com.microsoft")],
            [_vi("x", [2, 4])], _out("y"), [init("b", _f32(4, seed=3))], ms=True), {"x": _f32(2, 4)})),
        _extra("bias_gelu", "BiasGelu", lambda: (_model(
            [helper.make_node("BiasGelu", ["x", "b"], ["y"], domain="com.microsoft")],
            [_vi("x", [2, 4])], _out("y"), [init("b", _f32(4, seed=3))], ms=True), {"x": _f32(2, 4)})),
        _extra("skip_layer_norm", "SkipLayerNormalization", lambda: (_model(
            [helper.make_node("SkipLayerNormalization", ["x", "s", "g", "b"], ["y"], domain="com.microsoft")],
            [_vi("x", [1, 2, 4]), _vi("s", [1, 2, 4])], _out("y"),
            [init("g", _f32(4, seed=3)), init("b", _f32(4, seed=4))], ms=True),
            {"x": _f32(1, 2, 4), "s": _f32(1, 2, 4, seed=1)})),
        _extra("matmul_integer16", "MatMulInteger16", lambda: (_model(
            [helper.make_node("MatMulInteger16", ["a", "b"], ["y"], domain="com.microsoft")],
            [_vi("a", [2, 3], TensorProto.INT16), _vi("b", [3, 2], TensorProto.INT16)], _out("y"), ms=True),
            {"a": _rng(1).integers(-9, 9, (2, 3)).astype(np.int16),
             "b": _rng(2).integers(-9, 9, (3, 2)).astype(np.int16)})),
    ]
    return cases
