"""TVM failures and warnings, named in source terms (tvm_probe/diagnose/failures.py, called from the build).

Every case is a real model that real TVM 0.27 fails on or warns about:

* a BERT whose attention does ``masked_fill(mask == 0, ...)`` on a bool mask (import fixes off):
  LLVM rejects the kernel that compares the mask ("fcmp oeq i1");
* an ONNX ``Slice`` with a negative step that is validly empty (onnxruntime runs it): TVM's
  ``LegalizeOps`` fails on it;
* ``Pow(x, 3)`` and ``Gather``, which TVM warns about while legalizing;
* a kernel that raises while the VM runs it (an external kernel, ``call_dps_packed``).
"""
from __future__ import annotations

import gc
import html
import re

import numpy as np
import pytest

from tvm_probe.core.schema import PIPELINES
from onnx import TensorProto, helper, numpy_helper

from tvm_probe import PipelineError, ProbeError
from tvm_probe.diagnose import compile_with_snapshots
from tvm_probe.core.errors import ModelError, TVMCompileError, TVMError, TVMRunError
from tvm_probe.core.errors import tvm_message
from tvm_probe.diagnose.failures import CompileWarning, run_failure
from tvm_probe.importer.torch_export import stack_origin
from tvm_probe.core.native_log import native_log_to_logging, release_native
from tvm_probe.importer.onnx import import_onnx
from tvm_probe.kernel_map import build_kernel_map

from support import SUPPORT
from support.relax_models import refusing_module

POW_WARNING = ("Detected pow(x, y) where y >= 3, it is recommended to avoid this as it may lead to uninteded "
               "behaviors when x < 0. Perhaps with `x * x * x ...` or `pow(x, 2) * pow(x, 2) ...`.")
GATHER_WARNING = "Fast mode segfaults when there are out-of-bounds indices. Make sure input indices are in bound"
HANDWRITTEN = SUPPORT / "handwritten_models.py"
vi = helper.make_tensor_value_info


def _line_of(text: str) -> int:
    """The line of tests/support/handwritten_models.py that holds ``text`` (what a stack trace points at)."""
    lines = HANDWRITTEN.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def _one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert text and "\n" not in text, text
    return text


# ------------------------------------------------------------------------------ build failures
@pytest.fixture(scope="module")
def bool_mask_bert():
    """codertimo/BERT-pytorch's attention (``mask == 0`` on a bool mask), imported without the
    import fix, with each value's origin set from the fx stack trace as the importer will."""
    pytest.importorskip("torch")
    from support.handwritten_models import codertimo_bert

    from tvm_probe.importer.torch import export_program, import_torch

    module, args = codertimo_bert(layers=2, mask_style="eq0")
    imported = import_torch(module, args, import_fixes=False)
    for node in export_program(module, args).graph.nodes:
        if node.name in imported.sources:
            imported.sources[node.name].origin = stack_origin(node.meta.get("stack_trace"))
    return imported


@pytest.mark.parametrize("pipeline, kernel, also", [
    ("default", "equal", ""),
    ("fused", "fused_reshape5_divide1_equal_where",
     " (the kernel also computes 'view_11', 'div_1', 'where' and 3 more)"),
])
def test_bool_mask_build_failure_names_kernel_and_source_ops(bool_mask_bert, pipeline, kernel, also):
    imported = bool_mask_bert
    with pytest.raises(TVMCompileError) as err:
        compile_with_snapshots(imported.mod, "llvm", pipeline, imported=imported)
    assert isinstance(err.value, TVMError) and isinstance(err.value, PipelineError)  # exit status 4
    at = f"handwritten_models.py:{_line_of('(mask == 0)')}"
    assert re.sub(r"%\d+", "%N", _one_line(err)) == (
        f"building for llvm failed in kernel '{kernel}' at source ops 'eq' (aten.eq.Scalar at {at}), "
        f"'eq_1' (aten.eq.Scalar at {at}){also}: LLVM module verification failed with the following errors: "
        "Invalid operand types for FCmp instruction; %N = fcmp oeq i1 %N, false; the model has a construct TVM "
        "0.27 cannot build at 'eq', 'eq_1': import fix 'bool_compare_constant' (comparing a bool tensor with "
        "0/1/False/True becomes logical_not or the tensor itself) rewrites it: import with import_fixes=True")
    failure = err.value.failure
    assert (failure.stage, failure.kernels, failure.keys, failure.unknown) == ("build", (kernel,), ("eq", "eq_1"), "")
    assert failure.error_type == "InternalError"
    # TVM's whole message, every line, is kept (and logged at INFO)
    assert err.value.details.splitlines()[0] == "LLVM module verification failed with the following errors:"
    assert "!dbg" in err.value.details
    # the snapshots of the failed build let the kernel map run: the failing sites are the kernel's
    kmap = build_kernel_map(imported, err.value.snapshots)
    assert [kmap.sites[i].symbol for i in failure.sites] == [kernel, kernel]


def test_build_failure_without_source_names_still_names_the_kernel():
    """``compile_with_snapshots(mod, ...)`` without the ImportedModel: the kernel, and why no op."""
    pytest.importorskip("torch")
    import torch

    from tvm_probe.importer.torch import import_torch

    class BoolCompare(torch.nn.Module):
        def forward(self, scores, x):
            return scores.masked_fill((x > 0) == 0, -1e9)

    args = (torch.randn(2, 4, generator=torch.Generator().manual_seed(1)), torch.randn(2, 4))
    imported = import_torch(BoolCompare(), args, import_fixes=False)
    with pytest.raises(TVMCompileError) as err:
        compile_with_snapshots(imported.mod, "llvm", "default")
    assert re.sub(r"%\d+", "%N", _one_line(err)) == (
        "building for llvm failed in kernel 'equal' (source names unknown: compile_with_snapshots was not "
        "given the ImportedModel): LLVM module verification failed with the following errors: Invalid operand "
        "types for FCmp instruction; %N = fcmp oeq i1 %N, false")
    with pytest.raises(TVMCompileError) as err:
        compile_with_snapshots(imported.mod, "llvm", "default", imported=imported)
    assert _one_line(err).startswith("building for llvm failed in kernel 'equal' at source op 'eq' "
                                     "(aten.eq.Scalar at test_tvm_failures.py:")


# ------------------------------------------------------------------------------ pipeline failures
def _empty_slice():
    from support.tvm_bugs import slice_empty_negative_step

    return slice_empty_negative_step()


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_empty_negative_step_slice_names_the_pass_and_the_node(pipeline, capfd):
    from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values

    model, feeds = _empty_slice()
    assert onnxruntime_values(model, feeds)["bug/slice:0"].shape == (0,)  # valid ONNX: empty
    imported = import_onnx(model)
    with pytest.raises(TVMCompileError) as err:
        compile_with_snapshots(imported.mod, "llvm", pipeline, imported=imported)
    assert _one_line(err) == (
        f"pipeline '{pipeline}' failed for target llvm in pass LegalizeOps at source op 'bug/slice' (Slice): "
        "Check failed: (strides[i] < 0 ? (end_i <= begin_i) : (begin_i <= end_i)) is false: "
        "Input [Begin=0, End=5] is invalid for axis=0")
    failure = err.value.failure
    assert (failure.stage, failure.pass_name, failure.keys) == ("pipeline", "LegalizeOps", ("bug/slice:0",))
    assert err.value.snapshots.passes[-1] == "LegalizeOps"
    del err
    gc.collect()
    assert capfd.readouterr().err == ""  # TVM's native log stays off stderr, before and after


def test_a_failing_whole_module_pass_is_named_without_guessing_an_op():
    """A pass that is not op-local cannot be run one binding at a time: no op is named."""
    import tvm
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name="RefuseEverything")
    def refuse(mod, ctx):
        raise ValueError("this pass refuses every module")

    model, _ = _empty_slice()
    imported = import_onnx(model)
    pipeline = tvm.transform.Sequential([refuse, relax.get_pipeline("default")], name="mine")
    with pytest.raises(TVMCompileError) as err:
        compile_with_snapshots(imported.mod, "llvm", pipeline, imported=imported)
    assert _one_line(err) == ("pipeline 'mine' failed for target llvm in pass RefuseEverything (RefuseEverything "
                              "works on the whole module, so no single source op can be named): this pass refuses "
                              "every module")
    assert err.value.failure.keys == () and err.value.failure.error_type == "ValueError"


def test_an_op_a_pass_rebuilt_is_not_given_a_source_name():
    """A pass before LegalizeOps that makes new Vars: the failing op is found but has no name."""
    import tvm
    from tvm import relax

    @tvm.transform.module_pass(opt_level=0, name="FreshVars")
    def fresh_vars(mod, ctx):
        return tvm.IRModule({gv: relax.utils.copy_with_new_vars(f) if isinstance(f, relax.Function) else f
                             for gv, f in mod.functions.items()}, attrs=mod.attrs)

    model, _ = _empty_slice()
    imported = import_onnx(model)
    pipeline = tvm.transform.Sequential([fresh_vars, relax.get_pipeline("default")], name="renamed")
    with pytest.raises(TVMCompileError) as err:
        compile_with_snapshots(imported.mod, "llvm", pipeline, imported=imported)
    assert _one_line(err).startswith("pipeline 'renamed' failed for target llvm in pass LegalizeOps (the failing "
                                     "op (relax.strided_slice) has no source name): Check failed: ")


# ------------------------------------------------------------------------------ warnings
def _pow_gather_model(exponent: float = 3.0):
    nodes = [helper.make_node("Pow", ["x", "exponent"], ["y"], name="cube"),
             helper.make_node("Pow", ["x", "two"], ["y2"], name="square"),
             helper.make_node("Gather", ["table", "ids"], ["g"], name="emb")]
    inits = [numpy_helper.from_array(np.array(exponent, np.float32), "exponent"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.arange(10, dtype=np.float32).reshape(5, 2), "table")]
    graph = helper.make_graph(nodes, "warns", [vi("x", TensorProto.FLOAT, [4]), vi("ids", TensorProto.INT64, [3])],
                              [vi("y", TensorProto.FLOAT, [4]), vi("y2", TensorProto.FLOAT, [4]),
                               vi("g", TensorProto.FLOAT, [3, 2])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_compile_warnings_are_attributed_to_their_nodes(pipeline, capfd):
    imported = import_onnx(_pow_gather_model())
    built = compile_with_snapshots(imported.mod, "llvm", pipeline, imported=imported)
    assert built.warnings == [CompileWarning(POW_WARNING, ("y",), "LegalizeOps", ("relax.power",)),
                              CompileWarning(GATHER_WARNING, ("g",), "LegalizeOps", ("relax.take",))]
    assert [w.summary(imported.sources) for w in built.warnings] == [
        f"TVM warns at source op 'cube' (Pow): {POW_WARNING}",
        f"TVM warns at source op 'emb' (Gather): {GATHER_WARNING}"]
    assert [CompileWarning.from_record(w.to_record()) for w in built.warnings] == built.warnings
    assert capfd.readouterr().err == ""  # neither the compile nor the attribution prints them


def test_no_warning_no_attribution():
    model = _pow_gather_model(exponent=2.0)
    del model.graph.node[2], model.graph.output[2]  # no Gather either
    imported = import_onnx(model)
    built = compile_with_snapshots(imported.mod, "llvm", "fused", imported=imported)
    assert built.find_warnings is None and built.warnings == []


def test_warnings_without_source_names_are_not_attributed():
    imported = import_onnx(_pow_gather_model())
    built = compile_with_snapshots(imported.mod, "llvm", "default")
    assert [(w.message, w.keys) for w in built.warnings] == [(POW_WARNING, ()), (GATHER_WARNING, ())]


def test_torch_pow_warning_names_fx_nodes_and_lines():
    pytest.importorskip("torch")
    from support.handwritten_models import codertimo_bert

    from tvm_probe.importer.torch import export_program, import_torch

    module, args = codertimo_bert(layers=2)
    imported = import_torch(module, args)
    for node in export_program(module, args).graph.nodes:
        if node.name in imported.sources:
            imported.sources[node.name].origin = stack_origin(node.meta.get("stack_trace"))
    built = compile_with_snapshots(imported.mod, "llvm", "fused", imported=imported)
    at = f"handwritten_models.py:{_line_of('torch.pow(x, 3)')}"
    assert f"TVM warns at source ops 'pow_1' (aten.pow.Tensor_Scalar at {at}), 'pow_2' (aten.pow.Tensor_Scalar " \
           f"at {at}): {POW_WARNING}" in [w.summary(imported.sources) for w in built.warnings]


# ------------------------------------------------------------------------------ run failures
def test_a_kernel_that_raises_at_run_time_is_named():
    """An external kernel (``call_dps_packed``) raises inside the VM: the error names that call."""
    import tvm
    from tvm import relax

    from tvm_probe.importer.model import ImportedModel
    from tvm_probe.core.sources import Kind, SourceMap, SourceValue

    mod, (x, y, z, w) = refusing_module("tvm_probe_tests.refuse")
    sources = SourceMap(model_inputs=["x"], model_outputs=["add"])
    for key, op, kind in [("x", "Input", Kind.INPUT), ("exp", "Exp", Kind.VALUE), ("custom", "MyOp", Kind.VALUE),
                          ("add", "Add", Kind.VALUE)]:
        sources.add(SourceValue(key=key, node=key, op_type=op, kind=kind))
    imported = ImportedModel(mod=mod, sources=sources, var_keys={x: ["x"], y: ["exp"], z: ["custom"], w: ["add"]})
    built = compile_with_snapshots(imported.mod, "llvm", "fused", imported=imported)
    kmap = build_kernel_map(imported, built.snapshots)

    running = []  # what capture.py's hook knows: the site whose before-call ran, its after-call not
    order = iter(kmap.sites)

    def hook(func, symbol, before_run, ret_value, *args):
        if symbol.startswith("vm.builtin."):
            return 0
        if before_run:
            running.append(next(order).index)
        else:
            running.pop()
        return 0

    vm = relax.VirtualMachine(built.executable, tvm.cpu())
    vm.set_instrument(hook)
    with pytest.raises(ValueError) as raised:
        vm["main"](tvm.runtime.tensor(np.ones(4, np.float32)))
    error = run_failure(raised.value, kmap, running[-1], sources)
    assert isinstance(error, TVMRunError) and isinstance(error, TVMError)
    assert str(error) == ("the compiled model failed while running kernel call #1 'tvm_probe_tests.refuse' "
                          "(source op 'custom' (MyOp)): the custom kernel refuses its input")
    assert error.failure.kernels == ("tvm_probe_tests.refuse",) and error.failure.keys == ("custom",)
    # all the native instrument knows is the first site that did not finish: said so
    assert str(run_failure(raised.value, kmap, 1, sources, finished=True)).startswith(
        "the compiled model failed in the VM just before, or while running, kernel call #1 ")
    assert str(run_failure(raised.value, kmap, None)) == (
        "the compiled model failed (the kernel being run is not known): the custom kernel refuses its input")


# ------------------------------------------------------------------------------ helpers
def test_tvm_message_keeps_the_lines_that_say_what_failed():
    err = RuntimeError("LLVM module verification failed with the following errors: \n"
                       "Invalid operand types for FCmp instruction\n  %9 = fcmp oeq i1 %8, false, !dbg !169\n")
    assert tvm_message(err) == (
        "LLVM module verification failed with the following errors: Invalid operand types for FCmp instruction; "
        "%9 = fcmp oeq i1 %8, false",
        "LLVM module verification failed with the following errors:\nInvalid operand types for FCmp instruction\n"
        "%9 = fcmp oeq i1 %8, false, !dbg !169")
    assert tvm_message(ValueError("Check failed: (x) is false: : bad in tvm::topi"))[0] == (
        "Check failed: (x) is false: bad in tvm::topi")


def test_stack_origin_is_the_users_line_on_a_real_export():
    pytest.importorskip("torch")
    from support.handwritten_models import codertimo_bert

    from tvm_probe.importer.torch import export_program

    program = export_program(*codertimo_bert(layers=1, mask_style="eq0"))
    origin = {n.name: stack_origin(n.meta.get("stack_trace")) for n in program.graph.nodes}
    assert origin["eq"] == f"{HANDWRITTEN}:{_line_of('(mask == 0)')}"
    # nn.Embedding's own frames are PyTorch's: the user's line is the one that called it
    assert origin["embedding"] == f"{HANDWRITTEN}:{_line_of('self.token(sequence)')}"
    first_input = next(n.name for n in program.graph.nodes if n.op == "placeholder")
    assert origin[first_input] == "" and stack_origin(None) == ""  # inputs have no stack trace


def _failed_import():
    """An ONNX import TVM fails on (ConstantOfShape of an empty shape, import fix off)."""
    empty = numpy_helper.from_array(np.zeros(0, np.int64), "empty")
    nodes = [helper.make_node("Constant", [], ["shape"], name="shape", value=empty),
             helper.make_node("ConstantOfShape", ["shape"], ["t"], name="cos",
                              value=numpy_helper.from_array(np.array([True]))),
             helper.make_node("And", ["m", "t"], ["y"], name="and")]
    graph = helper.make_graph(nodes, "g", [vi("m", TensorProto.BOOL, [2, 3])], [vi("y", TensorProto.BOOL, [2, 3])])
    try:
        import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), import_fixes=False)
    except ModelError as err:
        return err
    raise AssertionError("the import was expected to fail")


def test_tvm_native_log_never_follows_a_one_line_error(capfd):
    """TVM logs "BlockBuilder destroyed with remaining blocks!" when the failed importer's
    BlockBuilder is freed — whenever the error is; release_native frees it inside the capture."""
    err = _failed_import()
    del err
    gc.collect()
    assert "BlockBuilder destroyed with remaining blocks!" in capfd.readouterr().err  # the symptom
    err = _failed_import()
    with native_log_to_logging():
        release_native(err)
    assert isinstance(err, ProbeError) and "\n" not in str(err)
    del err
    gc.collect()
    assert capfd.readouterr().err == ""


def test_warnings_reach_the_report_and_survive_a_dump(tmp_path):
    from tvm_probe import Probe, load_dump
    from tvm_probe.show.report import write_report

    model = _pow_gather_model()
    probe = Probe.from_onnx(model, pipeline="fused")
    probe.run({i.name: np.ones([d.dim_value for d in i.type.tensor_type.shape.dim],
                               dtype=np.int64 if i.type.tensor_type.elem_type == 7 else np.float32)
               for i in model.graph.input})
    expected = [f"TVM warns at source op 'cube' (Pow): {POW_WARNING}",
                f"TVM warns at source op 'emb' (Gather): {GATHER_WARNING}"]
    assert probe.findings() == expected
    probe.dump(tmp_path / "dump")
    reader = load_dump(tmp_path / "dump")
    assert reader.findings() == expected
    page = write_report(tmp_path / "rep", reader, formats=("html",))["html"].read_text()
    # in their own section, after the verdict: each message once, with the ops it concerns
    assert page.index('id="verdict"') < page.index('id="warnings"') < page.index('id="compile-warnings"')
    section = page[page.index('id="compile-warnings"'):]
    for message, op in [(POW_WARNING, "cube (Pow)"), (GATHER_WARNING, "emb (Gather)")]:
        assert section.count(html.escape(message)) == 1 and html.escape(op) in section
