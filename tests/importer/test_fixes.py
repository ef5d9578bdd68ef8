"""Import fixes: one test per fix on the minimal graph that TVM 0.27 cannot build as written.

Each test shows that the plain import (TVM's own ``from_onnx`` / ``from_exported_program`` and
build) fails with the upstream symptom, that the fixed import builds and computes what the
reference computes (onnxruntime, eager PyTorch), that the fix is recorded with the source op it
touched, and that with ``import_fixes=False`` the error names the construct and the fix.
"""
from __future__ import annotations

import numpy as np
import pytest

from tvm_probe.core.schema import PIPELINES
from onnx import TensorProto, helper, numpy_helper

from tvm_probe import ModelError, PipelineError, Probe
from tvm_probe.diagnose import compile_with_snapshots
from tvm_probe.importer.fixes import FIXES, AppliedFix, unfixed_hint
from tvm_probe.importer.onnx import import_onnx
from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values

vi = helper.make_tensor_value_info


def _const(name: str, value) -> object:
    value = np.asarray(value)
    return helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(value, name))


def _model(nodes, inputs, outputs):
    graph = helper.make_graph(nodes, "fix", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _plain_import_fails(model, symptom: str) -> None:
    from tvm.relax.frontend.onnx import from_onnx

    with pytest.raises(Exception) as info:
        from_onnx(model)
    assert symptom in str(info.value)


def _probe_matches_onnxruntime(model, feeds, fix: str, sources: tuple[str, ...]) -> None:
    """Both pipelines probe the fixed import; every value equals onnxruntime's."""
    reference = onnxruntime_values(model, feeds)
    for pipeline in PIPELINES:
        probe = Probe.from_onnx(model, pipeline=pipeline)
        assert [(f.name, f.sources) for f in probe.imported.fixes] == [(fix, sources)]
        probe.run(feeds)
        for key, value in reference.items():
            np.testing.assert_array_equal(probe.get(key), value, err_msg=f"{pipeline} {key}")


def _run_built(model, feeds) -> list[np.ndarray]:
    """Import with fixes, build with ``tvm.compile`` and run in the Relax VM (data-dependent shapes)."""
    import tvm
    from tvm import relax

    imported = import_onnx(model)
    vm = relax.VirtualMachine(tvm.compile(imported.mod, "llvm"), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(feeds[s.name]) for s in imported.inputs])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def _off_error(model, node: str, op: str, fix: str) -> str:
    with pytest.raises(ModelError) as info:
        import_onnx(model, import_fixes=False)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"TVM's ONNX importer failed on node '{node}' (op {op}): ")
    assert message.endswith(f": import fix '{fix}' ({FIXES[fix].does}) rewrites this construct: "
                            "import with import_fixes=True")
    return message


# -- constant_of_shape_scalar ------------------------------------------------------------------
def _empty_shape_mask(constant_of_shape: bool):
    """``Constant(int64[0]) → ConstantOfShape(value=True) → And(m, ·)``; or the scalar written out."""
    scalar = [_const("empty", np.zeros(0, np.int64)),
              helper.make_node("ConstantOfShape", ["empty"], ["t"], name="cos",
                               value=numpy_helper.from_array(np.array([True])))]
    nodes = (scalar if constant_of_shape else [_const("t", np.array(True))]) + [
        helper.make_node("And", ["m", "t"], ["y"], name="and")]
    return _model(nodes, [vi("m", TensorProto.BOOL, [2, 3])], [vi("y", TensorProto.BOOL, [2, 3])])


def test_constant_of_shape_scalar():
    import tvm

    model = _empty_shape_mask(constant_of_shape=True)
    feeds = {"m": np.array([[True, False, True], [False, True, True]])}
    _plain_import_fails(model, "broadcast_to expects the input shape to have the number of ndim at least")
    _probe_matches_onnxruntime(model, feeds, "constant_of_shape_scalar", ("cos",))
    message = _off_error(model, "cos", "ConstantOfShape", "constant_of_shape_scalar")
    assert "the given tensor has ndim 1 while the target shape has ndim 0" in message
    # the ops the fix did not touch are those of a plain import of the scalar written out
    written_out = _empty_shape_mask(constant_of_shape=False)
    tvm.ir.assert_structural_equal(import_onnx(written_out).mod, import_onnx(model).mod, map_free_vars=True)


# -- reshape_scalar_shape_value ----------------------------------------------------------------
def test_reshape_scalar_shape_value():
    """``Shape(x)[1:2] → Squeeze → Reshape([-1])``: TVM holds the squeezed dim as a PrimValue."""
    model = _model([helper.make_node("Shape", ["x"], ["s"], name="shape", start=1, end=2),
                    helper.make_node("Squeeze", ["s"], ["n"], name="squeeze"),
                    _const("minus1", np.array([-1], np.int64)),
                    helper.make_node("Reshape", ["n", "minus1"], ["r"], name="reshape"),
                    helper.make_node("Cast", ["r"], ["f"], name="cast", to=TensorProto.FLOAT),
                    helper.make_node("Mul", ["x", "f"], ["y"], name="mul")],
                   [vi("x", TensorProto.FLOAT, [2, 3])], [vi("y", TensorProto.FLOAT, [2, 3])])
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    _plain_import_fails(model, "Reshape expects the input data to be a Tensor. However, the given input is ir.PrimType")
    _probe_matches_onnxruntime(model, feeds, "reshape_scalar_shape_value", ("reshape",))
    _off_error(model, "reshape", "Reshape", "reshape_scalar_shape_value")


# -- fixes for tensors whose shape TVM lost (data-dependent Slice) ------------------------------
# A Slice with run-time starts/ends gives a tensor of known rank, unknown dims: the state the
# dynamo and tf2onnx exports put TVM in.  The kernel map needs static shapes, so these fixed
# modules are checked by building and running them directly.

_SLICE_INPUTS = [vi("st", TensorProto.INT64, [1]), vi("en", TensorProto.INT64, [1])]
_SLICE_FEEDS = {"st": np.array([1]), "en": np.array([3])}


def _sliced(nodes, x_shape, y_shape):
    slice_node = helper.make_node("Slice", ["x", "st", "en"], ["s"], name="slice")
    return _model([slice_node, *nodes], [vi("x", TensorProto.FLOAT, x_shape), *_SLICE_INPUTS],
                  [vi("y", TensorProto.FLOAT, y_shape)])


def _check_built(model, feeds, fix: str, node: str) -> None:
    (expected,) = onnxruntime_values(model, feeds, ["y"]).values()
    (got,) = _run_built(model, feeds)
    np.testing.assert_array_equal(got, expected)
    assert [(f.name, f.sources) for f in import_onnx(model).fixes] == [(fix, (node,))]


def test_reshape_unknown_shape():
    model = _sliced([_const("shape", np.array([-1], np.int64)),
                     helper.make_node("Reshape", ["s", "shape"], ["y"], name="reshape")], [4, 3], ["n"])
    feeds = {"x": np.arange(12, dtype=np.float32).reshape(4, 3), **_SLICE_FEEDS}
    _plain_import_fails(model, "Reshape expects the input tensor to have known shape when there is some "
                               "dimension length to infer")
    _check_built(model, feeds, "reshape_unknown_shape", "reshape")
    _off_error(model, "reshape", "Reshape", "reshape_unknown_shape")


def test_shape_value_as_tensor():
    model = _sliced([helper.make_node("Shape", ["s"], ["sh"], name="shape"), _const("zero", np.array(0, np.int64)),
                     helper.make_node("Gather", ["sh", "zero"], ["g"], name="gather"),
                     helper.make_node("Cast", ["g"], ["f"], name="cast", to=TensorProto.FLOAT),
                     helper.make_node("Mul", ["x", "f"], ["y"], name="mul")], [4, 3], [4, 3])
    feeds = {"x": np.arange(12, dtype=np.float32).reshape(4, 3), **_SLICE_FEEDS}
    _plain_import_fails(model, "shape_of expects a tensor input, but received R.Shape(ndim=2)")
    _check_built(model, feeds, "shape_value_as_tensor", "gather")
    _off_error(model, "gather", "Gather", "shape_value_as_tensor")


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool_unknown_shape(op):
    model = _sliced([helper.make_node(op, ["s"], ["y"], name="pool")], [1, 2, 4, 4], [1, 2, 1, 1])
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32), **_SLICE_FEEDS}
    _plain_import_fails(model, "object of type 'NoneType' has no len()")
    _check_built(model, feeds, "global_pool_unknown_shape", "pool")
    _off_error(model, "pool", op, "global_pool_unknown_shape")


# -- bool_compare_constant (PyTorch) -----------------------------------------------------------
try:
    import torch
except ImportError:  # the ONNX tests above still run
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")

_HIDE = {"== 0": lambda m: m == 0, "!= 1": lambda m: m != 1, "== False": lambda m: m == False,  # noqa: E712
         "== 1": lambda m: m == 1, "!= 0": lambda m: m != 0, "== 2": lambda m: m == 2,
         "not": lambda m: m.logical_not(), "mask": lambda m: m}


def _bool_compare(how: str):
    """``scores.masked_fill(mask <how>, -1e9)`` with a bool ``mask``; and two example inputs."""
    class BoolCompare(torch.nn.Module):
        def forward(self, scores, x):
            return scores.masked_fill(_HIDE[how](x > 0), -1e9)

    args = (torch.randn(2, 4, generator=torch.Generator().manual_seed(1)),
            torch.randn(2, 4, generator=torch.Generator().manual_seed(2)))
    return BoolCompare(), args


@needs_torch
@pytest.mark.parametrize("how, written", [("== 0", "not"), ("!= 1", "not"), ("== False", "not"),
                                          ("== 1", "mask"), ("!= 0", "mask")])
def test_bool_compare_constant(how, written):
    import tvm
    from tvm.relax.frontend.torch import from_exported_program

    from tvm_probe.importer.torch import export_program, import_torch
    from tvm_probe.comparison.reference.torch import torch_values

    module, args = _bool_compare(how)
    plain = from_exported_program(export_program(module, args))
    with pytest.raises(PipelineError, match="LLVM module verification failed"):  # fcmp oeq i1
        compile_with_snapshots(plain, "llvm", "default")
    reference = torch_values(module, args)
    node = "eq" if how.startswith("==") else "ne"
    for pipeline in PIPELINES:
        probe = Probe.from_torch(module, args, pipeline=pipeline)
        assert [(f.name, f.sources) for f in probe.imported.fixes] == [("bool_compare_constant", (node,))]
        probe.run([a.numpy() for a in args])
        for key in probe.imported.sources.values:
            np.testing.assert_array_equal(probe.get(key), reference[key], err_msg=f"{pipeline} {key}")
    # every op the fix did not touch is that of a plain import of the equivalent written out
    tvm.ir.assert_structural_equal(from_exported_program(export_program(_bool_compare(written)[0], args)),
                                   probe.imported.mod, map_free_vars=True)
    off = import_torch(module, args, import_fixes=False)
    assert off.fixes == [] and [f.name for f in off.unfixed] == ["bool_compare_constant"]
    tvm.ir.assert_structural_equal(plain, off.mod, map_free_vars=True)


@needs_torch
def test_bool_compare_with_other_constants_is_left_alone():
    """``mask == 2`` is not a construct the fix understands (torch compares it as an int)."""
    from tvm_probe.importer.torch import import_torch

    imported = import_torch(*_bool_compare("== 2"))
    assert imported.fixes == [] and imported.unfixed == []


def test_unfixed_constructs_are_named_in_build_errors():
    unfixed = [AppliedFix("bool_compare_constant", FIXES["bool_compare_constant"].does, "", ("eq", "eq_1"))]
    assert unfixed_hint(unfixed) == (
        "the model has a construct TVM 0.27 cannot build at 'eq', 'eq_1': import fix 'bool_compare_constant' "
        "(comparing a bool tensor with 0/1/False/True becomes logical_not or the tensor itself) rewrites it: "
        "import with import_fixes=True")
    assert unfixed_hint([]) == ""


@needs_torch
@pytest.mark.slow
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_upstream_bert_pytorch_probes_with_its_one_fix(pipeline):
    """Issue 17's model: BERT as BERT-pytorch writes it (8 blocks, hidden 256, 4 heads, vocab 15,
    padded inputs; ``masked_fill(mask == 0, ...)`` on a bool mask), every module path equal to
    eager PyTorch, the summary naming the one fix."""
    from support.handwritten_models import codertimo_bert

    module, args = codertimo_bert(layers=8, hidden=256, heads=4, vocab=15, mask_style="eq0")
    probe = Probe.from_torch(module, args, pipeline=pipeline)
    assert [f.name for f in probe.import_fixes] == ["bool_compare_constant"]
    assert probe.findings()[0].startswith("import fix 'bool_compare_constant' applied at eq, eq_1, eq_2 and 5 more: ")
    probe.run([a.numpy() for a in args])
    from support.torch_models import eager_module_outputs

    tensors = eager_module_outputs(module, args)  # every module called through __call__
    assert len(tensors) > 100
    for path, expected in tensors.items():
        np.testing.assert_allclose(probe.get(f"module:{path}"), expected, atol=1e-4, err_msg=path)


@needs_torch
def test_a_real_export_differs_from_its_plain_import_only_where_fixed(tmp_path):
    """A static legacy export of a transformers-5 BERT: the fixed import equals a plain import of
    the same ONNX graph with the one fixed node written out as the constant it computes."""
    import onnx
    import tvm

    from support.hf_models import export_legacy, hf_bert

    pytest.importorskip("transformers")
    module, args = hf_bert()
    proto = onnx.load(str(export_legacy(module, args, tmp_path / "bert.onnx", ["input_ids", "attention_mask"], {})))
    fixed = import_onnx(proto)
    assert [(f.name, f.sources) for f in fixed.fixes] == [("constant_of_shape_scalar", ("/bert/ConstantOfShape",))]
    written = onnx.ModelProto()
    written.CopyFrom(proto)
    index, node = next((i, n) for i, n in enumerate(written.graph.node) if n.name == "/bert/ConstantOfShape")
    value = numpy_helper.to_array(node.attribute[0].t).reshape(())
    written.graph.node.remove(node)
    written.graph.node.insert(index, _const(node.output[0], value))
    plain = import_onnx(written, import_fixes=False)
    assert plain.fixes == []
    tvm.ir.assert_structural_equal(plain.mod, fixed.mod, map_free_vars=True)
