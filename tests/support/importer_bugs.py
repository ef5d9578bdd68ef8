"""Real importer bugs of apache-tvm 0.27: TVM's ONNX frontend (``tvm.relax.frontend.onnx.from_onnx``)
itself computes a value wrongly at import time and writes it into the Relax module as a constant.

These are test cases for ``blame``, which must answer "importer" for them: the imported Relax module
already holds the wrong value before any pass runs, and no TVM kernel computes it.  The ground truth
here is established with plain TVM and onnxruntime only — nothing of tvm_probe is imported, so the
truth does not depend on the tool it tests.

The root cause (``Equal._impl_v13`` of the ONNX frontend, unchanged on apache/tvm main as of
2026-08-22): when both inputs of an ONNX ``Equal`` are a ``relax.ShapeExpr`` (what the frontend makes
of a ``Shape`` output) or a constant, the frontend folds the comparison at import time with

    output = [tvm_ffi.structural_equal(l, r) for l, r in zip(lhs, rhs)]
    return relax.const(output, "bool")

which is wrong twice over:

* a constant's elements come out of ``get_prim_expr_list`` as Python ``int`` while a ShapeExpr's are
  ``tirx.IntImm``; ``structural_equal(IntImm("int64", 3), 3)`` is ``False``, so *every* element of
  Shape-vs-constant compares unequal, even for static, fully known shapes;
* two distinct symbolic dimensions (``n`` and ``m``) are not structurally equal, so the importer
  decides "different" although the values are only known at run time (and are equal in the run).

Each :class:`ImporterBug` gives ``build()`` -> (``onnx.ModelProto``, seeded numpy inputs) with named
nodes (``bug/...``), the ONNX tensor that is the first wrong value (``first_wrong_tensor``, output of
``first_wrong_node``), and :func:`experiment` re-establishes the truth: onnxruntime vs TVM (``from_onnx``,
``tvm.compile(mod, "llvm")``, ``relax.VirtualMachine``) on the graph outputs and on the first wrong
tensor, plus the constant the importer wrote into the module and the printed line holding it.
``importer_bugs.md`` next to this file tells what was searched, run and seen.

Each case was checked to misbehave in apache-tvm 0.27.0.post1 (llvm), onnxruntime 1.32.0 and onnx
1.23.2 before it was written down; a case that stops misbehaving after an upgrade fails
``tests/tools/test_importer_bugs_truth.py``, which is the signal to drop it (or to record the fix).

Not a library module: tests import it as ``support.importer_bugs``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 17
SEED = 0


@dataclass(frozen=True)
class ImporterBug:
    build: Callable[[], tuple]        # () -> (onnx.ModelProto, {input name: seeded numpy array})
    upstream: str                     # "apache/tvm#NNN" or "found here"
    note: str
    first_wrong_node: str = "bug/equal"   # ONNX node whose output is the first wrong value
    first_wrong_tensor: str = ""          # that output's tensor name


# ------------------------------------------------------------------ models
def _model(name, nodes, inputs, outputs, initializers):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _i64(name, values):
    return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)


def _float_input(name, dims):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def _rng():
    return np.random.default_rng(SEED)


def _build_equal_shape_const():
    """Static shape: Equal(Shape(x) = [3, 4], [3, 5]) is [True, False]; TVM folds it to [False, False]."""
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"], name="bug/shape"),
        helper.make_node("Equal", ["x_shape", "expected_shape"], ["dims_match"], name="bug/equal"),
        helper.make_node("Not", ["dims_match"], ["dims_differ"], name="bug/not"),
    ]
    model = _model(
        "equal_shape_const", nodes, [_float_input("x", [3, 4])],
        [helper.make_tensor_value_info("dims_differ", TensorProto.BOOL, [2])],
        [_i64("expected_shape", [3, 5])])
    return model, {"x": _rng().standard_normal((3, 4)).astype(np.float32)}


def _build_equal_shape_shape_symbolic():
    """Equal(Shape(x: [n, 4]), Shape(y: [m, 4])) with n = m = 3 at run time is [True, True]; TVM
    folds n-vs-m to False at import: [False, True]."""
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"], name="bug/shape_x"),
        helper.make_node("Shape", ["y"], ["y_shape"], name="bug/shape_y"),
        helper.make_node("Equal", ["x_shape", "y_shape"], ["same_dims"], name="bug/equal"),
        helper.make_node("Not", ["same_dims"], ["dims_differ"], name="bug/not"),
    ]
    model = _model(
        "equal_shape_shape_symbolic", nodes,
        [_float_input("x", ["n", 4]), _float_input("y", ["m", 4])],
        [helper.make_tensor_value_info("dims_differ", TensorProto.BOOL, [2])], [])
    rng = _rng()
    return model, {"x": rng.standard_normal((3, 4)).astype(np.float32),
                   "y": rng.standard_normal((3, 4)).astype(np.float32)}


def _build_equal_batch_symbolic():
    """The "batch == 1" test of exported models: Equal(Slice(Shape(x: [n, 4]), 0, 1), [1]) with n = 1
    is [True]; TVM folds it to [False] at import."""
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"], name="bug/shape"),
        helper.make_node("Slice", ["x_shape", "starts", "ends"], ["batch"], name="bug/slice"),
        helper.make_node("Equal", ["batch", "one"], ["is_single"], name="bug/equal"),
        helper.make_node("Not", ["is_single"], ["is_batched"], name="bug/not"),
    ]
    model = _model(
        "equal_batch_symbolic", nodes, [_float_input("x", ["n", 4])],
        [helper.make_tensor_value_info("is_batched", TensorProto.BOOL, [1])],
        [_i64("starts", [0]), _i64("ends", [1]), _i64("one", [1])])
    return model, {"x": _rng().standard_normal((1, 4)).astype(np.float32)}


_NOTE_ROOT = ("Equal._impl_v13 folds ShapeExpr-vs-constant/ShapeExpr at import with "
              "tvm_ffi.structural_equal per element and emits relax.const(..., 'bool'). ")

IMPORTER_BUGS: dict[str, ImporterBug] = {
    "equal_shape_const": ImporterBug(
        build=_build_equal_shape_const,
        upstream="found here",
        note=_NOTE_ROOT + (
            "Static shape [3, 4] vs initializer [3, 5]: the constant's elements are Python ints, the "
            "ShapeExpr's are IntImm, and structural_equal(IntImm(3), 3) is False, so 3 == 3 comes out "
            "False. Imported constant [False, False]; ONNX/onnxruntime: [True, False]."),
        first_wrong_tensor="dims_match",
    ),
    "equal_shape_shape_symbolic": ImporterBug(
        build=_build_equal_shape_shape_symbolic,
        upstream="found here",
        note=_NOTE_ROOT + (
            "Shapes [n, 4] and [m, 4]: distinct symbolic vars n, m are not structurally equal, so the "
            "importer decides n != m although only the run knows (n = m = 3 here). Imported constant "
            "[False, True]; onnxruntime: [True, True]."),
        first_wrong_tensor="same_dims",
    ),
    "equal_batch_symbolic": ImporterBug(
        build=_build_equal_batch_symbolic,
        upstream="found here",
        note=_NOTE_ROOT + (
            "Slice(Shape(x: [n, 4]), 0, 1) stays the ShapeExpr [n]; compared with initializer [1] it "
            "folds to [False] for every n (n = 1 here). Imported constant [False]; onnxruntime: [True]."),
        first_wrong_tensor="is_single",
    ),
}


# ------------------------------------------------------------------ experiment
def _ort_run(model, inputs, extra_outputs=()):
    import onnxruntime as ort

    model = onnx.ModelProto.FromString(model.SerializeToString())
    for name in extra_outputs:
        model.graph.output.append(helper.make_empty_tensor_value_info(name))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    return dict(zip(names, session.run(names, inputs)))


def _walk_bindings(func):
    for block in func.body.blocks:
        yield from block.bindings


def _constants_in(expr):
    import tvm

    if isinstance(expr, tvm.ir.GenericConst):
        return [expr]
    found = []
    for arg in getattr(expr, "args", None) or []:
        found.extend(_constants_in(arg))
    for field in getattr(expr, "fields", None) or []:
        found.extend(_constants_in(field))
    return found


def _imported_bool_constant(mod):
    """The first bool constant of main's bindings (the folded Equal) and the printed line holding it."""
    text = mod.script()
    for binding in _walk_bindings(mod["main"]):
        for const in _constants_in(binding.value):
            if str(const.ty.dtype) == "bool":
                name = binding.var.name
                line = next(ln.strip() for ln in text.splitlines()
                            if ln.strip().startswith(f"{name}:") or ln.strip().startswith(f"{name} ="))
                return const.value.numpy(), line
    return None, None


def _tvm_values_before(model, inputs, node_name):
    """TVM's values of ``node_name``'s non-initializer inputs: the graph cut just before that node."""
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    nodes = list(model.graph.node)
    idx = [n.name for n in nodes].index(node_name)
    initializers = {i.name for i in model.graph.initializer}
    wanted = [t for t in nodes[idx].input if t not in initializers]
    cut = onnx.ModelProto()
    cut.CopyFrom(model)
    del cut.graph.node[:]
    cut.graph.node.extend(nodes[:idx])
    del cut.graph.output[:]
    cut.graph.output.extend(helper.make_tensor_value_info(t, TensorProto.INT64, [None]) for t in wanted)
    vm = relax.VirtualMachine(tvm.compile(from_onnx(cut, opset=OPSET), "llvm"), tvm.cpu())
    result = vm["main"](*[tvm.runtime.tensor(inputs[i.name]) for i in cut.graph.input])
    results = list(result) if len(wanted) > 1 else [result]
    as_array = lambda r: r.numpy() if hasattr(r, "numpy") else np.asarray(list(r), dtype=np.int64)
    return {t: as_array(r) for t, r in zip(wanted, results)}


def experiment(name: str) -> dict:
    """Re-establish one bug with plain TVM and onnxruntime.

    Returns ``onnxruntime`` / ``tvm``: the graph outputs (lists of arrays, graph order);
    ``onnxruntime_first_wrong``: onnxruntime's value of the first wrong tensor; ``imported_constant``:
    the bool constant the importer wrote into main (None if none); ``imported_text_line``: the line of
    the printed module holding it; ``imported_text``: the whole printed module; ``upstream_right``:
    whether onnxruntime's values of the first wrong node's inputs equal what the importer holds for
    them (the Shape/Slice outputs are right, so the first wrong value is the Equal's output).
    """
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    bug = IMPORTER_BUGS[name]
    model, inputs = bug.build()
    node = next(n for n in model.graph.node if n.name == bug.first_wrong_node)
    assert bug.first_wrong_tensor in node.output, (name, bug.first_wrong_tensor)

    initializers = {i.name for i in model.graph.initializer}
    ort_values = _ort_run(model, inputs, [bug.first_wrong_tensor]
                          + [t for t in node.input if t not in initializers])
    graph_outputs = [o.name for o in model.graph.output]

    mod = from_onnx(model, opset=OPSET)
    constant, line = _imported_bool_constant(mod)

    vm = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())
    result = vm["main"](*[tvm.runtime.tensor(inputs[i.name]) for i in model.graph.input])
    tvm_outputs = [result.numpy()] if hasattr(result, "numpy") else [r.numpy() for r in result]

    # the first wrong node's inputs as TVM computes them: the same graph cut just before that node,
    # with its non-initializer inputs as outputs (the importer keeps Shape outputs as R.shape values,
    # which the VM returns as tvm_ffi Shape objects)
    inputs_tvm = _tvm_values_before(model, inputs, bug.first_wrong_node)
    upstream_right = all(np.array_equal(ort_values[n], v) for n, v in inputs_tvm.items())

    return {
        "onnxruntime": [ort_values[n] for n in graph_outputs],
        "tvm": tvm_outputs,
        "onnxruntime_first_wrong": ort_values[bug.first_wrong_tensor],
        "imported_constant": constant,
        "imported_text_line": line,
        "imported_text": mod.script(),
        "upstream_right": upstream_right,
        "first_wrong_node": bug.first_wrong_node,
        "first_wrong_tensor": bug.first_wrong_tensor,
    }
