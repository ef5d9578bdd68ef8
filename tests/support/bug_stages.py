"""Ground truth for ``blame``: which stage of apache-tvm 0.27 is responsible for each real bug of
:mod:`support.tvm_bugs`, established by experiment with plain TVM, numpy and onnxruntime (nothing of
tvm_probe is imported here, so the truth does not depend on the tool it is meant to test).

The stages:

* ``"importer"``: ``tvm.relax.frontend.onnx.from_onnx`` wrote a Relax module whose meaning already
  differs from the ONNX node (wrong attribute, wrong constant, wrong shape) — TVM's kernel computes
  what the Relax op says, but the Relax op says the wrong thing.
* ``"pass"``: a named pass of the pipeline (``pass_name``) turns a right module into a wrong one.
* ``"kernel"``: the Relax op as imported means what the ONNX node means, but TVM's lowering of it
  (LegalizeOps/TOPI, TIR lowering, LLVM codegen) computes another value or fails to compile.

:func:`experiment` re-runs, per bug, the experiment that decides it and returns what it observed
(small arrays, shapes, op names, the decisive TIR line, error texts); ``bug_stages.md`` next to this
file tells what was run and seen.  The decision rule the observations are read with:

* "the ONNX meaning": onnxruntime on the bug's nodes alone (and ``onnx.reference``, the ONNX
  project's own Python evaluator, as a second witness; :data:`ONNX_WITNESS` names the bug where
  onnxruntime is itself inconsistent and the reference stands for ONNX);
* "the Relax meaning": a numpy evaluation of the imported Relax module, op by op, of what each Relax
  op is documented to compute (:data:`_RELAX_NUMPY`; NaN follows numpy/IEEE-754 ``maximum``: a NaN
  operand gives NaN — the Relax docstrings say nothing about NaN, see ``bug_stages.md``);
* "the kernel": the same Relax ops written directly in TVMScript (no importer), built with
  ``tvm.compile(mod, "llvm")`` — both with the ``default`` pipeline and with ``default_build``
  (LegalizeOps and the mandatory lowering only, no optimising pass) — and run.

Relax meaning != ONNX meaning and kernel == Relax meaning: importer.  Relax meaning == ONNX meaning
and kernel != Relax meaning (or kernel fails to build): kernel — unless ``default_build`` gets it
right, which would point at an optimising pass of ``default`` (no bug here does that).

Not a library module: tests import it as ``support.bug_stages``.
"""
from __future__ import annotations

import functools
import traceback
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from support.tvm_bugs import BUGS

STAGE_NAMES = ("importer", "pass", "kernel")


@dataclass(frozen=True)
class Stage:
    stage: str               # "importer", "pass" or "kernel"
    pass_name: str | None    # the pass at fault, for stage "pass" only
    evidence: str            # what the experiment showed, in a sentence or two

    def __post_init__(self):
        assert self.stage in STAGE_NAMES, self.stage
        assert (self.pass_name is not None) == (self.stage == "pass"), (self.stage, self.pass_name)


STAGES: dict[str, Stage] = {
    "relu_nan": Stage(
        "kernel", None,
        "from_onnx writes R.nn.relu(x) (faithful: max(NaN, 0) is NaN, as onnxruntime says); R.nn.relu "
        "written in TVMScript and built gives 0.0 for NaN under both pipelines: LegalizeOps writes "
        "`compute = T.max(x, T.float32(0.0))`, which LLVM codegen lowers to `fcmp ogt` + `select` "
        "(T.max(NaN, 0) is 0, T.max(0, NaN) is NaN)."),
    "sign_nan": Stage(
        "kernel", None,
        "from_onnx writes R.sign(x) (faithful); R.sign written in TVMScript and built gives 0.0 for "
        "NaN: the legalized TIR is `T.Select(0 < x, 1, T.Select(x < 0, -1, 0))`, whose comparisons "
        "are both false for NaN."),
    "hardsigmoid_nan": Stage(
        "kernel", None,
        "from_onnx writes R.clip(0.2 * x + 0.5, 0, 1) (faithful: NaN in, NaN out); R.clip written in "
        "TVMScript and built gives 1.0 for NaN: the legalized TIR is "
        "`T.max(T.min(x, T.float32(1.0)), T.float32(0.0))` and T.min(NaN, 1) is 1."),
    "clip_nan": Stage(
        "kernel", None,
        "from_onnx emits TOPI's maximum/minimum as call_tir (`T.max(A, lo)` then `T.min(., hi)`) "
        "after sanitising NaN bounds — faithful if T.max means IEEE maximum; the same chain written as "
        "R.minimum(R.maximum(x, 0), 6) in TVMScript gives 0.0 for NaN (and R.clip(x, 0, 6) gives 6.0): "
        "T.max(NaN, lo) is lowered to `fcmp ogt` + `select` and drops the NaN."),
    "min_nan": Stage(
        "kernel", None,
        "from_onnx writes Min(a, b) as R.min(R.stack((a, b)), axis=0) (faithful under numpy: NaN); "
        "that module written in TVMScript, and R.minimum(a, b) too, give b where a is NaN: the "
        "reduction is `x_red = T.min(x_red, x[k])` from +FLT_MAX, and T.min(NaN, b) is b."),
    "reducemax_nan": Stage(
        "kernel", None,
        "from_onnx writes R.max(x, axis=[1], keepdims=True) (faithful: numpy and onnx.reference give "
        "NaN for every row holding a NaN); built from TVMScript it ignores a leading NaN and keeps a "
        "trailing one: `x_red = T.max(x_red, x[k])` from -FLT_MAX, T.max(NaN, v) is v."),
    "resize_half_pixel": Stage(
        "importer", None,
        "from_onnx turns scales=2.5 into R.image.resize2d(x, size=(7, 7)), which by definition "
        "samples with scale 3/7 = in/out, not 1/2.5; TVM's kernel computes exactly that, and so does "
        "onnxruntime given sizes=[7, 7] — only onnxruntime given the model's scales=2.5 differs."),
    "maxpool_same_lower": Stage(
        "importer", None,
        "from_onnx writes R.nn.max_pool2d(padding=[0, 0, 0, 0]) with struct_info (1, 1, 2, 2) where "
        "onnxruntime gives (1, 1, 3, 3); TVM's kernel computes exactly the unpadded 2x2 pool, and the "
        "same op with padding [1, 1, 1, 1] (what SAME_LOWER pads) gives onnxruntime's values."),
    "maxpool_same_lower_then_reshape": Stage(
        "importer", None,
        "from_onnx itself raises (Reshape's type inference: product 4 vs 9) because the MaxPool it "
        "imported is (1, 1, 2, 2) instead of onnxruntime's (1, 1, 3, 3); the Reshape node imported "
        "alone on a (1, 1, 3, 3) input imports, builds and matches onnxruntime."),
    "slice_empty_negative_step": Stage(
        "kernel", None,
        "from_onnx writes R.strided_slice(begin=[0], end=[5], strides=[-1]) — the ONNX values, empty "
        "like numpy's x[0:5:-1]; the same op written in TVMScript infers shape (-5,) and fails to "
        "build in LegalizeOps (TOPI strided_slice: \"Input [Begin=0, End=5] is invalid for axis=0\")."),
}


#: Which observation stands for "the ONNX meaning" of a divergence (default: onnxruntime).  Where
#: the witnesses disagree, the one that follows the ONNX spec's text: for ReduceMax onnxruntime 1.32
#: is itself order-dependent on NaN (NaN for a leading NaN, the others' max for a trailing one), while
#: ``onnx.reference`` (np.maximum.reduce) gives NaN for both.  (For MaxPool SAME_LOWER it is the
#: other way round: ``onnx.reference`` 1.23 uses floor(in / stride) like TVM's importer, against the
#: spec's ceil and ONNX's own shape inference, (1, 1, 3, 3); onnxruntime follows the spec.)
ONNX_WITNESS = {"reducemax_nan": "onnx_reference"}


# ------------------------------------------------------------------ the bug's nodes, alone
def bug_nodes_model(name: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The bug's nodes (``BUGS[name].nodes``) cut out of its model, with the initializers they read,
    and the values their inputs have in the whole model (onnxruntime on the whole model)."""
    whole, whole_inputs = BUGS[name].build()
    inferred = onnx.shape_inference.infer_shapes(whole)
    infos = {vi.name: vi for vi in list(inferred.graph.input) + list(inferred.graph.value_info)
             + list(inferred.graph.output)}
    inits = {t.name: t for t in whole.graph.initializer}
    nodes = [n for n in whole.graph.node if n.name in BUGS[name].nodes]
    produced = {o for n in nodes for o in n.output}
    consumed = [i for n in nodes for i in n.input if i]
    inputs = list(dict.fromkeys(i for i in consumed if i not in produced and i not in inits))
    outputs = [o for n in nodes for o in n.output if o not in consumed]
    graph = helper.make_graph(nodes, f"{name}_nodes", [infos[i] for i in inputs],
                              [infos[o] for o in outputs],
                              [inits[i] for i in dict.fromkeys(consumed) if i in inits])
    model = helper.make_model(graph, opset_imports=list(whole.opset_import))
    model.ir_version = whole.ir_version
    # the values those inputs have in the whole model: expose them as outputs of the whole model
    probe = onnx.ModelProto()
    probe.CopyFrom(whole)
    probe.graph.output.extend(infos[i] for i in inputs if i not in {o.name for o in whole.graph.output})
    names = [o.name for o in probe.graph.output]
    values = dict(zip(names, _ort_session(probe).run(None, whole_inputs)))
    return model, {i: values[i] if i in values else whole_inputs[i] for i in inputs}


def _ort_session(model: onnx.ModelProto):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(model.SerializeToString(), options,
                                        providers=["CPUExecutionProvider"])


def _declared_shape(model: onnx.ModelProto) -> tuple[int, ...]:
    """The first output's shape as ONNX's own shape inference gives it (``bug_nodes_model`` declares
    the outputs with what ``onnx.shape_inference`` inferred in the whole model)."""
    return tuple(d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim)


def onnxruntime_run(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """onnxruntime's value of the model's first output."""
    return _ort_session(model).run(None, inputs)[0]


def onnx_reference_run(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """The ONNX project's own Python evaluator (``onnx.reference``), the spec written in numpy."""
    from onnx.reference import ReferenceEvaluator

    return np.asarray(ReferenceEvaluator(model).run(None, inputs)[0])


# ------------------------------------------------------------------ TVM, as it comes
def import_relax(model: onnx.ModelProto):
    from tvm.relax.frontend.onnx import from_onnx

    return from_onnx(model, keep_params_in_input=False)


def _bindings(mod):
    func = mod["main"]
    return [b for block in func.body.blocks for b in block.bindings]


def relax_ops(mod) -> tuple[str, ...]:
    """The ops main calls, in order; a call_tir as ``relax.call_tir:<PrimFunc name>``."""
    from tvm import relax

    names = []
    for b in _bindings(mod):
        if isinstance(b.value, relax.Call):
            name = b.value.op.name
            if name == "relax.call_tir":
                name += ":" + b.value.args[0].name_hint
            names.append(name)
    return tuple(names)


def relax_call(mod, op: str):
    """The first call of ``op`` in main."""
    from tvm import relax

    return next(b.value for b in _bindings(mod)
                if isinstance(b.value, relax.Call) and b.value.op.name == op)


def relax_output_shape(mod) -> tuple[int, ...]:
    """The shape main's (first) result is declared with: what the importer's type inference says."""
    ty = mod["main"].body.body.ty
    ty = ty.fields[0] if hasattr(ty, "fields") else ty
    return tuple(int(d) for d in ty.shape)


def tvm_run(mod, inputs: dict[str, np.ndarray], pipeline: str = "default") -> np.ndarray:
    """Build with ``tvm.compile(mod, "llvm", relax_pipeline=pipeline)``; run main on the inputs (in
    the order of main's parameters)."""
    import tvm
    from tvm import relax

    executable = tvm.compile(mod, "llvm", relax_pipeline=pipeline)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    args = [tvm.runtime.tensor(np.ascontiguousarray(v)) for v in inputs.values()]
    out = vm["main"](*args)
    out = out[0] if not hasattr(out, "numpy") else out
    return out.numpy()


def legalized_lines(mod, needle: str) -> list[str]:
    """The lines of ``LegalizeOps(mod)`` (the PrimFuncs TOPI writes for its ops) holding ``needle``."""
    from tvm import relax

    text = relax.transform.LegalizeOps()(mod).script()
    return [line.strip() for line in text.splitlines() if needle in line]


def build_failure(mod) -> dict:
    """Build ``mod`` (default pipeline) under a pass instrument; where it fails: the innermost pass
    whose before-hook ran and whose after-hook did not, and the error's last line."""
    import tvm

    @tvm.ir.instrument.pass_instrument
    class Trace:
        def __init__(self):
            self.open: list[str] = []
            self.finished: list[str] = []

        def run_before_pass(self, mod, info):
            self.open.append(info.name)

        def run_after_pass(self, mod, info):
            self.finished.append(self.open.pop())

    trace = Trace()
    try:
        with tvm.transform.PassContext(opt_level=3, instruments=[trace]):
            tvm.compile(mod, "llvm")
    except Exception as error:  # noqa: BLE001 — the failure is the observation
        return {"failed": True, "failing_pass": trace.open[-1] if trace.open else None,
                "open_passes": tuple(trace.open), "error": _last_line(error)}
    return {"failed": False, "failing_pass": None, "open_passes": (), "error": None}


def _last_line(error: BaseException) -> str:
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(error).__name__


def tir_max_operand_order() -> dict[str, float]:
    """A hand-written PrimFunc: ``T.max(x, 0)`` and ``T.max(0, x)`` on x = NaN, built for llvm —
    TIR's max is lowered to an ordered compare and a select, so a NaN survives only as 2nd operand."""
    import tvm
    from tvm.script import tirx as T

    @T.prim_func
    def maxes(x: T.Buffer((1,), "float32"), first: T.Buffer((1,), "float32"),
              second: T.Buffer((1,), "float32")):
        first[0] = T.max(x[0], T.float32(0.0))
        second[0] = T.max(T.float32(0.0), x[0])

    executable = tvm.compile(maxes, "llvm")
    x = tvm.runtime.tensor(np.array([np.nan], np.float32))
    first, second = (tvm.runtime.tensor(np.zeros(1, np.float32)) for _ in range(2))
    executable(x, first, second)
    ir = executable.mod.inspect_source("ll")
    return {"T.max(nan, 0)": float(first.numpy()[0]), "T.max(0, nan)": float(second.numpy()[0]),
            "llvm_ir_has_fcmp_ogt_select": "fcmp ogt" in ir and "select" in ir}


# ------------------------------------------------------------------ what the Relax ops mean, in numpy
def _maximum(x, y):
    return np.maximum(x, y)  # IEEE-754 maximum: NaN in either operand gives NaN


def _max_pool2d(x, attrs):
    assert attrs.layout == "NCHW" and not attrs.ceil_mode
    kh, kw = (int(v) for v in attrs.pool_size)
    sh, sw = (int(v) for v in attrs.strides)
    dh, dw = (int(v) for v in attrs.dilation)
    top, left, bottom, right = (int(v) for v in attrs.padding)
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=-np.inf)
    oh = (padded.shape[2] - ((kh - 1) * dh + 1)) // sh + 1
    ow = (padded.shape[3] - ((kw - 1) * dw + 1)) // sw + 1
    out = np.full(x.shape[:2] + (oh, ow), -np.inf, x.dtype)
    for i in range(kh):
        for j in range(kw):
            window = padded[:, :, i * dh: i * dh + (oh - 1) * sh + 1: sh, j * dw: j * dw + (ow - 1) * sw + 1: sw]
            out = _maximum(out, window)
    return out


def _resize2d(x, size, attrs):
    """nearest_neighbor + half_pixel + round_prefer_floor, as resize2d's docstring defines them (it
    points at topi/image/resize.py): in = (out + 0.5) * (in_size / out_size) - 0.5, index =
    ceil(in - 0.5), clamped to the image."""
    assert (attrs.layout, attrs.method, attrs.coordinate_transformation_mode, attrs.rounding_method) == (
        "NCHW", "nearest_neighbor", "half_pixel", "round_prefer_floor"), attrs
    index = []
    for in_size, out_size in zip(x.shape[2:], size):
        o = np.arange(out_size, dtype=np.float32)
        source = (o + 0.5) * (np.float32(in_size) / np.float32(out_size)) - 0.5
        index.append(np.clip(np.ceil(source - 0.5).astype(np.int64), 0, in_size - 1))
    return x[:, :, index[0][:, None], index[1][None, :]]


def _strided_slice(x, axes, begin, end, strides):
    """Python/numpy slicing; out-of-bound indices clipped (assume_inbound=False)."""
    index = [slice(None)] * x.ndim
    for a, b, e, s in zip(axes, begin, end, strides):
        index[a] = slice(b, e, s)
    return x[tuple(index)]


def _axes(call) -> tuple[int, ...]:
    return tuple(int(a) for a in call.attrs.axis)


_RELAX_NUMPY = {
    "relax.nn.relu": lambda c, x: _maximum(x, np.float32(0)),        # "ReLU(x) = max(x, 0)"
    "relax.sign": lambda c, x: np.sign(x),
    "relax.multiply": lambda c, x, y: np.multiply(x, y),
    "relax.add": lambda c, x, y: np.add(x, y),
    "relax.subtract": lambda c, x, y: np.subtract(x, y),
    "relax.clip": lambda c, x, lo, hi: np.minimum(_maximum(x, np.float32(lo)), np.float32(hi)),
    "relax.isnan": lambda c, x: np.isnan(x),
    "relax.where": lambda c, cond, x, y: np.where(cond, x, y),
    "relax.maximum": lambda c, x, y: _maximum(x, y),
    "relax.minimum": lambda c, x, y: np.minimum(x, y),
    # the importer's call_tir of TOPI's element-wise maximum / minimum ("element-wise maximum")
    "relax.call_tir:maximum": lambda c, args: _maximum(*args),
    "relax.call_tir:minimum": lambda c, args: np.minimum(*args),
    "relax.broadcast_to": lambda c, x, shape: np.broadcast_to(x, shape),
    "relax.stack": lambda c, xs: np.stack(xs, axis=int(c.attrs.axis)),
    "relax.min": lambda c, x: np.min(x, axis=_axes(c), keepdims=bool(c.attrs.keepdims)),  # NaN propagates
    "relax.max": lambda c, x: np.max(x, axis=_axes(c), keepdims=bool(c.attrs.keepdims)),
    "relax.nn.max_pool2d": lambda c, x: _max_pool2d(x, c.attrs),
    "relax.image.resize2d": lambda c, x, size: _resize2d(x, size, c.attrs),
    "relax.strided_slice": lambda c, x, axes, begin, end, strides: _strided_slice(x, axes, begin, end,
                                                                                   strides),
}


def relax_meaning(mod, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """Evaluate main with numpy, op by op, as each Relax op is documented to compute (no TVM kernel
    runs).  Only the ops the bugs' nodes import to are known."""
    from tvm import ir, relax

    func = mod["main"]
    env = {p: np.asarray(v) for p, v in zip(func.params, inputs.values())}

    def value(e):
        if isinstance(e, ir.GenericConst):
            return e.value.numpy()
        if isinstance(e, relax.ShapeExpr):
            return tuple(int(v) for v in e.values)
        if isinstance(e, relax.Tuple):
            return [value(f) for f in e.fields]
        if hasattr(e, "value") and not isinstance(e, relax.Var):  # IntImm / FloatImm / PrimValue
            return e.value.value if hasattr(e.value, "value") else e.value
        return env[e]

    for b in _bindings(mod):
        call = b.value
        if not isinstance(call, relax.Call):  # an alias: gv = lv
            env[b.var] = value(call)
            continue
        name = call.op.name
        if name == "relax.call_tir":
            name += ":" + call.args[0].name_hint
            args = [value(call.args[1])]
        else:
            args = [value(a) for a in call.args]
        env[b.var] = np.asarray(_RELAX_NUMPY[name](call, *args))
    out = func.body.body
    out = env[out] if out in env else value(out)
    return out[0] if isinstance(out, list) else out


# ------------------------------------------------------------------ the same Relax ops, without the importer
def direct_module(name: str, variant: str = "as_imported"):
    """The Relax ops the bug's nodes import to, written by hand in TVMScript (shapes of the bug).
    Every class has its own name: TVMScript finds a class's source by its name."""
    from tvm.script import ir as I
    from tvm.script import relax as R

    if name == "relu_nan":
        @I.ir_module
        class ReluModule:
            @R.function
            def main(x: R.Tensor((2, 6), "float32")):
                with R.dataflow():
                    y = R.nn.relu(x)
                    R.output(y)
                return y
        return ReluModule
    elif name == "sign_nan":
        @I.ir_module
        class SignModule:
            @R.function
            def main(x: R.Tensor((2, 6), "float32")):
                with R.dataflow():
                    y = R.sign(x)
                    R.output(y)
                return y
        return SignModule
    elif name == "hardsigmoid_nan":
        @I.ir_module
        class HardSigmoidModule:
            @R.function
            def main(x: R.Tensor((2, 6), "float32")):
                with R.dataflow():
                    a = R.multiply(R.const(0.2, "float32"), x)
                    b = R.add(a, R.const(0.5, "float32"))
                    y = R.clip(b, 0, 1)
                    R.output(y)
                return y
        return HardSigmoidModule
    elif name == "clip_nan" and variant == "as_imported":
        # the importer's call_tir(topi.maximum) / call_tir(topi.minimum), as the Relax ops that
        # legalize to those very TOPI kernels
        @I.ir_module
        class ClipAsImported:
            @R.function
            def main(x: R.Tensor((2, 6), "float32")):
                with R.dataflow():
                    a = R.maximum(x, R.const(0.0, "float32"))
                    y = R.minimum(a, R.const(6.0, "float32"))
                    R.output(y)
                return y
        return ClipAsImported
    elif name == "clip_nan" and variant == "relax_clip":
        @I.ir_module
        class ClipRelaxClip:
            @R.function
            def main(x: R.Tensor((2, 6), "float32")):
                with R.dataflow():
                    y = R.clip(x, 0, 6)
                    R.output(y)
                return y
        return ClipRelaxClip
    elif name == "min_nan" and variant == "as_imported":
        @I.ir_module
        class MinAsImported:
            @R.function
            def main(a: R.Tensor((2, 6), "float32"), b: R.Tensor((2, 6), "float32")):
                with R.dataflow():
                    s = R.stack((a, b), axis=0)
                    y = R.min(s, axis=[0], keepdims=False)
                    R.output(y)
                return y
        return MinAsImported
    elif name == "min_nan" and variant == "relax_minimum":
        @I.ir_module
        class MinRelaxMinimum:
            @R.function
            def main(a: R.Tensor((2, 6), "float32"), b: R.Tensor((2, 6), "float32")):
                with R.dataflow():
                    y = R.minimum(a, b)
                    R.output(y)
                return y
        return MinRelaxMinimum
    elif name == "reducemax_nan":
        @I.ir_module
        class ReduceMaxModule:
            @R.function
            def main(x: R.Tensor((4, 3), "float32")):
                with R.dataflow():
                    y = R.max(x, axis=[1], keepdims=True)
                    R.output(y)
                return y
        return ReduceMaxModule
    elif name == "resize_half_pixel":
        @I.ir_module
        class ResizeModule:
            @R.function
            def main(x: R.Tensor((1, 1, 3, 3), "float32")):
                with R.dataflow():
                    y = R.image.resize2d(x, R.shape([7, 7]), roi=[0.0, 0.0, 0.0, 0.0], layout="NCHW",
                                         method="nearest_neighbor",
                                         coordinate_transformation_mode="half_pixel",
                                         rounding_method="round_prefer_floor")
                    R.output(y)
                return y
        return ResizeModule
    elif name.startswith("maxpool_same_lower") and variant == "as_imported":
        @I.ir_module
        class MaxPoolAsImported:
            @R.function
            def main(x: R.Tensor((1, 1, 5, 5), "float32")):
                with R.dataflow():
                    y = R.nn.max_pool2d(x, pool_size=[3, 3], strides=[2, 2], padding=[0, 0, 0, 0])
                    R.output(y)
                return y
        return MaxPoolAsImported
    elif name.startswith("maxpool_same_lower") and variant == "same_lower_padding":
        @I.ir_module
        class MaxPoolSameLowerPadding:
            @R.function
            def main(x: R.Tensor((1, 1, 5, 5), "float32")):
                with R.dataflow():
                    y = R.nn.max_pool2d(x, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1])
                    R.output(y)
                return y
        return MaxPoolSameLowerPadding
    elif name == "slice_empty_negative_step":
        @I.ir_module
        class SliceModule:
            @R.function
            def main(x: R.Tensor((10,), "float32")):
                with R.dataflow():
                    y = R.strided_slice(x, axes=[0], begin=[0], end=[5], strides=[-1])
                    R.output(y)
                return y
        return SliceModule
    raise KeyError((name, variant))


# ------------------------------------------------------------------ the experiments
def _at_nan(values: np.ndarray, nan_mask: np.ndarray) -> tuple[float, ...]:
    """The distinct values at the positions where the bug's input is NaN."""
    picked = np.asarray(values)[nan_mask].ravel()
    numbers = sorted({float(v) for v in picked if not np.isnan(v)})
    return tuple(numbers) + ((float("nan"),) if np.isnan(picked).any() else ())


def _divergence(name: str, decisive: str | None) -> dict:
    """Import the bug's nodes alone and evaluate them four ways: ONNX (onnxruntime, onnx.reference),
    the Relax meaning (numpy), TVM on the imported module, TVM on the hand-written Relax ops."""
    model, inputs = bug_nodes_model(name)
    mod = import_relax(model)
    direct = direct_module(name)
    obs = {
        "relax_ops": relax_ops(mod),
        "onnx_shape": tuple(onnxruntime_run(model, inputs).shape),
        "onnx_inferred_shape": _declared_shape(model),
        "relax_shape": relax_output_shape(mod),
        "onnxruntime": onnxruntime_run(model, inputs),
        "onnx_reference": onnx_reference_run(model, inputs),
        "relax_meaning": relax_meaning(mod, inputs),
        "imported_tvm": tvm_run(mod, inputs),
        "kernel": tvm_run(direct, inputs),
        "kernel_default_build": tvm_run(direct, inputs, "default_build"),
        "inputs": inputs,
    }
    if decisive is not None:
        obs["tir"] = tuple(legalized_lines(direct, decisive))
    return obs


def _nan_unary(name: str, decisive: str) -> dict:
    obs = _divergence(name, decisive)
    nan = np.isnan(next(iter(obs["inputs"].values())))
    for key in ("onnxruntime", "onnx_reference", "relax_meaning", "imported_tvm", "kernel",
                "kernel_default_build"):
        obs[f"{key}_on_nan"] = _at_nan(obs[key], nan)
    return obs


def _experiment_relu_nan():
    obs = _nan_unary("relu_nan", "T.max(")
    obs["tir_max_order"] = tir_max_operand_order()
    return obs


def _experiment_sign_nan():
    return _nan_unary("sign_nan", "T.Select(")


def _experiment_hardsigmoid_nan():
    return _nan_unary("hardsigmoid_nan", "T.min(")


def _experiment_clip_nan():
    obs = _nan_unary("clip_nan", "T.max(")
    model, _ = bug_nodes_model("clip_nan")
    mod = import_relax(model)
    # the TIR the importer itself wrote (emit_te of topi.maximum / topi.minimum)
    obs["imported_tir"] = tuple(line.strip() for line in mod.script().splitlines()
                                if "= T.max(" in line or "= T.min(" in line)
    nan = np.isnan(next(iter(obs["inputs"].values())))
    obs["relax_clip_on_nan"] = _at_nan(tvm_run(direct_module("clip_nan", "relax_clip"), obs["inputs"]), nan)
    return obs


def _experiment_min_nan():
    obs = _divergence("min_nan", "T.min(")
    a = next(iter(obs["inputs"].values()))
    nan = np.isnan(a)
    for key in ("onnxruntime", "onnx_reference", "relax_meaning", "imported_tvm", "kernel",
                "kernel_default_build"):
        obs[f"{key}_on_nan"] = _at_nan(obs[key], nan)
    minimum = tvm_run(direct_module("min_nan", "relax_minimum"), obs["inputs"])
    b = list(obs["inputs"].values())[1]
    obs["kernel_equals_other_operand_on_nan"] = bool(np.array_equal(obs["kernel"][nan], b[nan]))
    obs["relax_minimum_on_nan"] = _at_nan(minimum, nan)
    return obs


def _experiment_reducemax_nan():
    obs = _divergence("reducemax_nan", "T.max(")
    x = next(iter(obs["inputs"].values()))
    obs["nan_rows"] = tuple(bool(r) for r in np.isnan(x).any(axis=1))
    obs["leading_nan_rows"] = tuple(bool(r) for r in np.isnan(x[:, 0]))
    return obs


def _experiment_resize_half_pixel():
    obs = _divergence("resize_half_pixel", None)
    call = relax_call(import_relax(bug_nodes_model("resize_half_pixel")[0]), "relax.image.resize2d")
    obs["resize_size"] = tuple(int(v) for v in call.args[1].values)
    obs["resize_attrs"] = {"method": call.attrs.method,
                           "coordinate_transformation_mode": call.attrs.coordinate_transformation_mode,
                           "rounding_method": call.attrs.rounding_method}
    # ONNX itself, asked for the size the importer kept instead of the scale it dropped
    model, inputs = bug_nodes_model("resize_half_pixel")
    node = model.graph.node[0]
    sizes = helper.make_tensor("resize_sizes", onnx.TensorProto.INT64, [4], [1, 1, 7, 7])
    sized = helper.make_graph(
        [helper.make_node("Resize", [node.input[0], "", "", "resize_sizes"], list(node.output),
                          name=node.name, **{a.name: helper.get_attribute_value(a) for a in node.attribute})],
        "resize_sizes", list(model.graph.input), list(model.graph.output), [sizes])
    sized_model = helper.make_model(sized, opset_imports=list(model.opset_import))
    sized_model.ir_version = model.ir_version
    obs["onnxruntime_with_sizes_7"] = onnxruntime_run(sized_model, inputs)
    return obs


def _experiment_maxpool_same_lower():
    obs = _divergence("maxpool_same_lower", None)
    mod = import_relax(bug_nodes_model("maxpool_same_lower")[0])
    obs["padding"] = tuple(int(v) for v in relax_call(mod, "relax.nn.max_pool2d").attrs.padding)
    obs["kernel_with_same_lower_padding"] = tvm_run(direct_module("maxpool_same_lower", "same_lower_padding"),
                                                    obs["inputs"])
    return obs


def _experiment_maxpool_same_lower_then_reshape():
    whole, _ = BUGS["maxpool_same_lower_then_reshape"].build()
    nodes_model, inputs = bug_nodes_model("maxpool_same_lower_then_reshape")
    obs = {}
    for key, model in (("whole", whole), ("nodes", nodes_model)):
        try:
            import_relax(model)
            obs[f"{key}_from_onnx_error"] = None
        except Exception as error:  # noqa: BLE001 — the failure is the observation
            frames = traceback.extract_tb(error.__traceback__)
            obs[f"{key}_from_onnx_error"] = _last_line(error)
            obs[f"{key}_raised_under"] = tuple(f.name for f in frames if "frontend" in f.filename)[:1]
            obs[f"{key}_raised_in"] = frames[-1].name
    # MaxPool alone: the importer's shape against onnxruntime's
    maxpool = bug_nodes_model("maxpool_same_lower")
    obs["maxpool_relax_shape"] = relax_output_shape(import_relax(maxpool[0]))
    obs["maxpool_onnx_shape"] = tuple(onnxruntime_run(*maxpool).shape)
    # Reshape alone, fed the (1, 1, 3, 3) the spec promises: imports, builds, agrees with onnxruntime
    reshape_node = next(n for n in nodes_model.graph.node if n.op_type == "Reshape")
    pooled = helper.make_tensor_value_info(reshape_node.input[0], onnx.TensorProto.FLOAT, [1, 1, 3, 3])
    graph = helper.make_graph([reshape_node], "reshape_alone", [pooled], list(nodes_model.graph.output),
                              [t for t in nodes_model.graph.initializer if t.name == reshape_node.input[1]])
    reshape_model = helper.make_model(graph, opset_imports=list(nodes_model.opset_import))
    reshape_model.ir_version = nodes_model.ir_version
    feed = {reshape_node.input[0]: onnxruntime_run(*maxpool)}
    reshape_mod = import_relax(reshape_model)
    obs["reshape_alone_relax_ops"] = relax_ops(reshape_mod)
    obs["reshape_alone_tvm"] = tvm_run(reshape_mod, feed)
    obs["reshape_alone_onnxruntime"] = onnxruntime_run(reshape_model, feed)
    return obs


def _experiment_slice_empty_negative_step():
    from tvm import relax, te, topi

    model, inputs = bug_nodes_model("slice_empty_negative_step")
    mod = import_relax(model)
    call = relax_call(mod, "relax.strided_slice")
    direct = direct_module("slice_empty_negative_step")
    x = next(iter(inputs.values()))
    obs = {
        "relax_ops": relax_ops(mod),
        "slice_args": tuple(tuple(int(v) for v in t.fields) for t in call.args[1:]),  # axes, begin, end, strides
        "onnx_shape": tuple(onnxruntime_run(model, inputs).shape),
        "onnx_reference_shape": tuple(onnx_reference_run(model, inputs).shape),
        "relax_meaning_shape": tuple(relax_meaning(mod, inputs).shape),
        "numpy_shape": x[0:5:-1].shape,
        "relax_shape": relax_output_shape(mod),
        "kernel_relax_shape": relax_output_shape(direct),
        "imported_build": build_failure(mod),
        "kernel_build": build_failure(direct),
    }
    try:
        relax.transform.LegalizeOps()(direct)
        obs["legalize_ops_error"] = None
    except Exception as error:  # noqa: BLE001
        obs["legalize_ops_error"] = _last_line(error)
    try:
        topi.strided_slice(te.placeholder((10,), "float32"), [0], [5], [-1], axes=[0])
        obs["topi_error"] = None
    except Exception as error:  # noqa: BLE001
        obs["topi_error"] = _last_line(error)
    return obs


_EXPERIMENTS = {
    "relu_nan": _experiment_relu_nan,
    "sign_nan": _experiment_sign_nan,
    "hardsigmoid_nan": _experiment_hardsigmoid_nan,
    "clip_nan": _experiment_clip_nan,
    "min_nan": _experiment_min_nan,
    "reducemax_nan": _experiment_reducemax_nan,
    "resize_half_pixel": _experiment_resize_half_pixel,
    "maxpool_same_lower": _experiment_maxpool_same_lower,
    "maxpool_same_lower_then_reshape": _experiment_maxpool_same_lower_then_reshape,
    "slice_empty_negative_step": _experiment_slice_empty_negative_step,
}
assert set(_EXPERIMENTS) == set(BUGS) == set(STAGES)


@functools.lru_cache(maxsize=None)
def _cached(bug_name: str) -> dict:
    return _EXPERIMENTS[bug_name]()


def experiment(bug_name: str) -> dict:
    """Re-run the experiment that decides ``bug_name``'s stage; the observations (cached per process:
    treat them as read-only)."""
    return _cached(bug_name)
