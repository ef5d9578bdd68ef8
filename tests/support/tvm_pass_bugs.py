"""Real pass bugs of apache-tvm 0.27, rebuilt from public apache/tvm reports: test cases for ``blame``
whose ground truth (which pass, which error, which values) was established by hand, with plain TVM
and numpy — nothing of tvm_probe is imported here, so the truth does not depend on the tool it tests.

Each :class:`PassBug` holds the module as the report wrote it (TVMScript or the BlockBuilder), the
pipeline the report ran (TVM's own, or the user's ``Sequential``), seeded numpy inputs, and the
ground truth:

* ``kind``: ``"compile"`` (a pass raises) or ``"wrong-value"`` (the module after the pass computes
  something else than the module before it, without any error);
* ``guilty_pass``: the pipeline step at fault, by its ``PassInfo`` name (``pass.info.name``);
* ``pass_path``: the passes open when it fails (compile) or when it starts (wrong-value), from the
  outermost, joined by ``">"``, as a ``tvm.ir.instrument.pass_instrument`` sees them with
  ``run_before_pass``/``run_after_pass`` (a pass that raises fires no after-hook).  It can go deeper
  than ``guilty_pass``: TVM's ``FuseTIR`` is a ``Sequential`` whose ``FuseTIRInner`` raises;
* ``error_type``/``error_text``: the exception class and the key text of TVM's message;
* ``expected``: for every bug, numpy's own computation of main's outputs from the inputs (so the
  module before the guilty pass can be shown right, and the one after it wrong).

:func:`experiment` re-establishes the ground truth by hand: the whole pipeline under a recording
instrument (for the path), then the pipeline's steps applied one at a time — the step that raises,
or the first step after which the module, finished with ``relax.get_pipeline("default")`` (which is
``default_build``: LegalizeOps and the mandatory lowering, no optimising pass) and run, gives other
values than numpy.  ``tvm_pass_bugs.md`` next to this file tells how each bug was found and what
the experiment showed.

Each case was checked to misbehave in apache-tvm 0.27.0.post1 (llvm) before it was written down; a
case that stops misbehaving after an upgrade fails ``tests/tools/test_tvm_pass_bugs_truth.py``,
which is the signal to drop it (or to record the fix).

Not a library module: tests import it as ``support.tvm_pass_bugs``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

KINDS = ("compile", "wrong-value")
RTOL = ATOL = 1e-3  # float32 results against numpy's float32/float64 arithmetic


@dataclass(frozen=True)
class PassBug:
    name: str
    upstream: str                         # "apache/tvm#20194"
    url: str
    summary: str
    build: Callable[[], tvm.IRModule]     # the module as the report wrote it
    pipeline: Callable[[], tvm.transform.Pass]   # what the report compiled it with (relax_pipeline=)
    steps: Callable[[], list]             # the pipeline's passes, in order, to apply one at a time
    target: str | None                    # the steps run `with Target(target)` (TVM's target pipeline)
    inputs: Callable[[], list]            # main's arguments: seeded numpy arrays, tuples for tuple params
    expected: Callable[[list], list]      # numpy's outputs of main (a list, one array per output)
    kind: str
    guilty_pass: str                      # PassInfo name of the pipeline step at fault
    pass_path: str                        # open passes from the outermost when it fails / starts
    error_type: type | None = None        # compile: the exception class raised
    error_text: str | None = None         # compile: key text of TVM's message
    expected_source: str = "numpy"
    notes: str = ""

    def __post_init__(self):
        assert self.kind in KINDS, self.kind
        assert (self.error_type is not None) == (self.kind == "compile"), self.name
        assert self.pass_path.split(">")[-1] == self.innermost_pass
        assert self.guilty_pass in self.pass_path.split(">"), (self.guilty_pass, self.pass_path)

    @property
    def innermost_pass(self) -> str:
        return self.pass_path.split(">")[-1]


# ------------------------------------------------------------------ pipelines, as the reports ran them
def _llvm_default_pipeline() -> tvm.transform.Pass:
    """``relax.get_default_pipeline(Target("llvm"))``: the CPU pipeline with fusion."""
    return relax.get_default_pipeline(tvm.target.Target("llvm"))


def _llvm_default_steps() -> list:
    """The passes of :func:`_llvm_default_pipeline`, from TVM's own pieces of it
    (``tvm/relax/backend/cpu_generic/pipeline.py``); its ``_pipeline`` runs them ``with target``."""
    from tvm.relax.backend.cpu_generic import pipeline as cpu

    target = tvm.target.Target("llvm")
    return (cpu.library_dispatch_passes(target) + cpu.legalize_passes(target)
            + cpu.dataflow_lower_passes(target) + cpu.finalize_passes(target))


def _then_default(pass_factory: Callable[[], tvm.transform.Pass]):
    """A user's pass sequence: one optional Relax pass, then ``relax.get_pipeline("default")``."""
    def pipeline():
        return tvm.transform.Sequential([pass_factory(), relax.get_pipeline("default")])

    def steps():
        return [pass_factory(), relax.get_pipeline("default")]

    return pipeline, steps


# ------------------------------------------------------------------ apache/tvm#20194: FuseTIR, "fused"
def _fused_name_module() -> tvm.IRModule:
    """A tensor selected through a nested tuple parameter: FuseOps groups the two TupleGetItems into
    a Primitive function with no op in it, which it names exactly ``fused``."""
    @I.ir_module
    class Module:
        @R.function
        def main(t: R.Tuple(R.Tuple(R.Tensor((2, 3), "float32"), R.Tensor((2, 3), "float32")),
                            R.Tensor((2, 3), "float32"))) -> R.Tensor((2, 3), "float32"):
            with R.dataflow():
                inner = t[0]
                z = inner[1]
                R.output(z)
            return z

    return Module


def _fused_name_inputs() -> list:
    rng = np.random.default_rng(20194)
    a, b, c = (rng.standard_normal((2, 3)).astype("float32") for _ in range(3))
    return [((a, b), c)]


# ------------------------------------------------------------------ apache/tvm#20205, #20197: CombineParallelMatmul
def _var(name: str, shape, dtype: str = "float32") -> relax.Var:
    return relax.Var(name, relax.TensorType(shape, dtype))


def _bias_broadcast_module() -> tvm.IRModule:
    """Two matmuls of one LHS whose biases broadcast differently ([1, 4] and [2, 5]): valid, but the
    pass concatenates the biases along axis 1."""
    bb = relax.BlockBuilder()
    x, w1, w2 = _var("x", (2, 3)), _var("w1", (3, 4)), _var("w2", (3, 5))
    b1, b2 = _var("b1", (1, 4)), _var("b2", (2, 5))
    with bb.function("main", [x, w1, w2, b1, b2]):
        with bb.dataflow():
            y1 = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, w1)), b1))
            y2 = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, w2)), b2))
            out = bb.emit_output(relax.Tuple([y1, y2]))
        bb.emit_func_output(out)
    return bb.get()


def _bias_broadcast_inputs() -> list:
    rng = np.random.default_rng(20205)
    return [rng.standard_normal(s).astype("float32") for s in [(2, 3), (3, 4), (3, 5), (1, 4), (2, 5)]]


def _vector_lhs_module() -> tvm.IRModule:
    """``matmul(x, A) + matmul(x, B)`` with a 1-D x: the combined matmul is 1-D, the pass splits axis 1."""
    @I.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((16,), "float32"), A: R.Tensor((16, 32), "float32"),
                 B: R.Tensor((16, 32), "float32")) -> R.Tensor((32,), "float32"):
            with R.dataflow():
                a = R.matmul(x, A)
                b = R.matmul(x, B)
                c = R.add(a, b)
                R.output(c)
            return c

    return Module


def _vector_rhs_module() -> tvm.IRModule:
    """``matmul(x, A) + matmul(x, B)`` with 1-D A and B: the pass reads a second RHS dimension."""
    @I.ir_module
    class Module:
        @R.function
        def main(x: R.Tensor((8, 16), "float32"), A: R.Tensor((16,), "float32"),
                 B: R.Tensor((16,), "float32")) -> R.Tensor((8,), "float32"):
            with R.dataflow():
                a = R.matmul(x, A)
                b = R.matmul(x, B)
                c = R.add(a, b)
                R.output(c)
            return c

    return Module


def _seeded(seed: int, *shapes) -> Callable[[], list]:
    def inputs():
        rng = np.random.default_rng(seed)
        return [rng.standard_normal(s).astype("float32") for s in shapes]
    return inputs


# ------------------------------------------------------------------ apache/tvm#20198: matmul rewrites drop out_dtype
def _expand_matmul_of_sum_module() -> tvm.IRModule:
    """``matmul(x, A + B, out_dtype="float32")`` on float16 operands.  ExpandMatmulOfSum rewrites it to
    ``matmul(x, A) + matmul(x, B)`` with ``out_dtype`` dropped: two float16 matmuls, added in float16,
    bound to a variable still annotated float32."""
    bb = relax.BlockBuilder()
    x, a, b = _var("x", (2, 4), "float16"), _var("A", (4, 3), "float16"), _var("B", (4, 3), "float16")
    with bb.function("main", [x, a, b]):
        with bb.dataflow():
            s = bb.emit(relax.op.add(a, b))
            out = bb.emit_output(relax.op.matmul(x, s, out_dtype="float32"))
        bb.emit_func_output(out)
    return bb.get()


def _expand_matmul_of_sum_inputs() -> list:
    """Sizes where float32 accumulation stays finite and float16 overflows (max float16: 65504):
    each x @ A is ~50 000, the sum ~100 000."""
    rng = np.random.default_rng(20198)
    x = rng.uniform(200, 300, (2, 4)).astype("float16")
    a = rng.uniform(40, 60, (4, 3)).astype("float16")
    b = rng.uniform(40, 60, (4, 3)).astype("float16")
    return [x, a, b]


def _expand_matmul_of_sum_expected(inputs: list) -> list:
    x, a, b = inputs
    s = (a + b).astype("float16")  # R.add of two float16 tensors: float16, as numpy rounds it
    return [x.astype("float32") @ s.astype("float32")]  # matmul(out_dtype="float32"): float32 arithmetic


def _expand_matmul_of_sum_const_module() -> tvm.IRModule:
    """The same, with A and B bound as constants (weights, as an importer leaves them)."""
    _, a, b = _expand_matmul_of_sum_inputs()
    values = {"A": tvm.runtime.tensor(a), "B": tvm.runtime.tensor(b)}
    return relax.transform.BindParams("main", values)(_expand_matmul_of_sum_module())


def _reorder_take_after_matmul_module() -> tvm.IRModule:
    """``matmul(x, take(W, idx, axis=1), out_dtype="float32")`` on float16 operands.
    ReorderTakeAfterMatmul rewrites it to ``take(matmul(x, W), idx, axis=1)`` with ``out_dtype``
    dropped: a float16 matmul."""
    bb = relax.BlockBuilder()
    x, w = _var("x", (1, 4), "float16"), _var("W", (4, 8), "float16")
    idx = _var("idx", (3,), "int64")
    with bb.function("main", [x, w, idx]):
        with bb.dataflow():
            wt = bb.emit(relax.op.take(w, idx, axis=1))
            out = bb.emit_output(relax.op.matmul(x, wt, out_dtype="float32"))
        bb.emit_func_output(out)
    return bb.get()


def _reorder_take_after_matmul_inputs() -> list:
    """x @ W is ~90 000: finite in float32, infinite in float16."""
    rng = np.random.default_rng(201980)
    x = rng.uniform(200, 300, (1, 4)).astype("float16")
    w = rng.uniform(80, 100, (4, 8)).astype("float16")
    idx = np.array([5, 0, 2], dtype="int64")
    return [x, w, idx]


def _reorder_take_after_matmul_expected(inputs: list) -> list:
    x, w, idx = inputs
    return [x.astype("float32") @ np.take(w, idx, axis=1).astype("float32")]


# ------------------------------------------------------------------ the table
_CPM_PIPELINE, _CPM_STEPS = _then_default(lambda: relax.transform.CombineParallelMatmul())
_EMOS_PIPELINE, _EMOS_STEPS = _then_default(lambda: relax.transform.ExpandMatmulOfSum())
_RTAM_PIPELINE, _RTAM_STEPS = _then_default(lambda: relax.transform.ReorderTakeAfterMatmul())

_BUG_LIST = [
    PassBug(
        name="fusetir_fused_name",
        upstream="apache/tvm#20194",
        url="https://github.com/apache/tvm/issues/20194",
        summary="FuseTIR aborts on the Primitive function FuseOps names exactly `fused` (a group of "
                "TupleGetItems through a nested tuple parameter, no op to name it after).",
        build=_fused_name_module,
        pipeline=_llvm_default_pipeline,
        steps=_llvm_default_steps,
        target="llvm",
        inputs=_fused_name_inputs,
        expected=lambda inputs: [inputs[0][0][1]],
        kind="compile",
        guilty_pass="FuseTIR",
        pass_path="_pipeline>sequential>FuseTIR>FuseTIRInner",
        error_type=tvm.error.InternalError,
        error_text='Check failed: (func_info_.global_name != "fused") is false',
        notes="relax.get_pipeline('default') (default_build, no fusion) compiles and runs it right.",
    ),
    PassBug(
        name="combine_parallel_matmul_bias_broadcast",
        upstream="apache/tvm#20205",
        url="https://github.com/apache/tvm/issues/20205",
        summary="CombineParallelMatmul concatenates biases of shapes [1, 4] and [2, 5] along axis 1 "
                "(it checks their ranks, not their other dimensions).",
        build=_bias_broadcast_module,
        pipeline=_CPM_PIPELINE,
        steps=_CPM_STEPS,
        target=None,
        inputs=_bias_broadcast_inputs,
        expected=lambda i: [i[0] @ i[1] + i[3], i[0] @ i[2] + i[4]],
        kind="compile",
        guilty_pass="CombineParallelMatmul",
        pass_path="sequential>CombineParallelMatmul",
        error_type=ValueError,
        error_text="Concat expects the input tensors to have the same shape on every dimension "
                   "except the one indicated by the input axis",
    ),
    PassBug(
        name="combine_parallel_matmul_vector_lhs",
        upstream="apache/tvm#20197",
        url="https://github.com/apache/tvm/issues/20197",
        summary="CombineParallelMatmul combines matmuls of a 1-D LHS, then splits the 1-D result "
                "along axis 1.",
        build=_vector_lhs_module,
        pipeline=_CPM_PIPELINE,
        steps=_CPM_STEPS,
        target=None,
        inputs=_seeded(201971, (16,), (16, 32), (16, 32)),
        expected=lambda i: [i[0] @ i[1] + i[0] @ i[2]],
        kind="compile",
        guilty_pass="CombineParallelMatmul",
        pass_path="sequential>CombineParallelMatmul",
        error_type=ValueError,
        error_text="the input axis 1 is out of range",
    ),
    PassBug(
        name="combine_parallel_matmul_vector_rhs",
        upstream="apache/tvm#20197",
        url="https://github.com/apache/tvm/issues/20197",
        summary="CombineParallelMatmul on matmuls with 1-D right-hand sides indexes a second RHS "
                "dimension that is not there.",
        build=_vector_rhs_module,
        pipeline=_CPM_PIPELINE,
        steps=_CPM_STEPS,
        target=None,
        inputs=_seeded(201972, (8, 16), (16,), (16,)),
        expected=lambda i: [i[0] @ i[1] + i[0] @ i[2]],
        kind="compile",
        guilty_pass="CombineParallelMatmul",
        pass_path="sequential>CombineParallelMatmul",
        error_type=IndexError,
        error_text="Index 1 out of bounds 1",
    ),
    PassBug(
        name="expand_matmul_of_sum_out_dtype",
        upstream="apache/tvm#20198",
        url="https://github.com/apache/tvm/issues/20198",
        summary="ExpandMatmulOfSum drops matmul's out_dtype='float32': the float16 operands are "
                "multiplied and summed in float16 (inf where float32 is finite), and main returns "
                "a float16 array although its signature still says float32.",
        build=_expand_matmul_of_sum_module,
        pipeline=_EMOS_PIPELINE,
        steps=_EMOS_STEPS,
        target=None,
        inputs=_expand_matmul_of_sum_inputs,
        expected=_expand_matmul_of_sum_expected,
        kind="wrong-value",
        guilty_pass="ExpandMatmulOfSum",
        pass_path="sequential>ExpandMatmulOfSum",
        expected_source="numpy: x @ (A + B) in float32 from the float16 inputs (A + B rounded to "
                        "float16, as R.add computes it); the module before the pass, built with "
                        "relax.get_pipeline('default'), gives the same",
    ),
    PassBug(
        name="expand_matmul_of_sum_out_dtype_const_weights",
        upstream="apache/tvm#20198",
        url="https://github.com/apache/tvm/issues/20198",
        summary="expand_matmul_of_sum_out_dtype with A and B bound as tensor constants: the same "
                "rewrite, in a module that `script(show_meta=True)` cannot print (TVM 0.27 segfaults).",
        build=_expand_matmul_of_sum_const_module,
        pipeline=_EMOS_PIPELINE,
        steps=_EMOS_STEPS,
        target=None,
        inputs=lambda: _expand_matmul_of_sum_inputs()[:1],
        expected=lambda inputs: _expand_matmul_of_sum_expected(inputs + _expand_matmul_of_sum_inputs()[1:]),
        kind="wrong-value",
        guilty_pass="ExpandMatmulOfSum",
        pass_path="sequential>ExpandMatmulOfSum",
        expected_source="numpy, as for expand_matmul_of_sum_out_dtype (same seed, same A and B)",
    ),
    PassBug(
        name="reorder_take_after_matmul_out_dtype",
        upstream="apache/tvm#20198",
        url="https://github.com/apache/tvm/issues/20198",
        summary="ReorderTakeAfterMatmul drops matmul's out_dtype='float32': the matmul runs in "
                "float16 (inf where float32 is finite) and main returns float16.",
        build=_reorder_take_after_matmul_module,
        pipeline=_RTAM_PIPELINE,
        steps=_RTAM_STEPS,
        target=None,
        inputs=_reorder_take_after_matmul_inputs,
        expected=_reorder_take_after_matmul_expected,
        kind="wrong-value",
        guilty_pass="ReorderTakeAfterMatmul",
        pass_path="sequential>ReorderTakeAfterMatmul",
        expected_source="numpy: x @ take(W, idx, axis=1) in float32 from the float16 inputs; the "
                        "module before the pass, built with relax.get_pipeline('default'), gives "
                        "the same",
    ),
]
BUGS: dict[str, PassBug] = {bug.name: bug for bug in _BUG_LIST}


# ------------------------------------------------------------------ running modules
def _to_tvm(value):
    if isinstance(value, (tuple, list)):
        return tuple(_to_tvm(v) for v in value)
    return tvm.runtime.tensor(np.ascontiguousarray(value))


def _flatten(value) -> list[np.ndarray]:
    if hasattr(value, "numpy"):
        return [value.numpy()]
    return [array for item in value for array in _flatten(item)]


def run_module(mod: tvm.IRModule, inputs: list, pipeline: tvm.transform.Pass | None = None) -> list[np.ndarray]:
    """main's outputs, flattened: ``mod`` compiled for llvm with ``pipeline`` (default:
    ``relax.get_pipeline("default")``) and run in the Relax VM on ``inputs``."""
    pipeline = relax.get_pipeline("default") if pipeline is None else pipeline
    executable = tvm.compile(mod, target="llvm", relax_pipeline=pipeline)
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return _flatten(vm["main"](*[_to_tvm(x) for x in inputs]))


def same_values(got: list[np.ndarray], expected: list[np.ndarray]) -> bool:
    """Same count, same shapes, allclose (NaN equal to NaN; inf only to the same inf)."""
    if len(got) != len(expected):
        return False
    return all(g.shape == e.shape and np.allclose(g.astype("float64"), e.astype("float64"),
                                                  rtol=RTOL, atol=ATOL, equal_nan=True)
               for g, e in zip(got, expected))


# ------------------------------------------------------------------ the experiment
@tvm.ir.instrument.pass_instrument
class PassRecorder:
    """The open passes, outermost first; the path of the innermost one whenever a pass starts."""

    def __init__(self):
        self.stack: list[str] = []
        self.started: list[str] = []

    def run_before_pass(self, mod, info):
        self.stack.append(info.name)
        self.started.append(">".join(self.stack))

    def run_after_pass(self, mod, info):
        self.stack.pop()


@dataclass
class Finding:
    """What :func:`experiment` saw."""
    name: str
    kind: str                                # "compile" when a step raised, else "wrong-value"/"ok"
    path: str | None                         # whole pipeline: open passes when it raised / when the guilty step started
    error: BaseException | None              # whole pipeline: what it raised
    guilty_step: str | None                  # by hand: the step that raised, or after which values changed
    step_error: BaseException | None         # by hand: what that step raised
    steps: list[str]                         # by hand: the steps applied, in order
    before: tvm.IRModule | None              # the module just before the guilty step
    after: tvm.IRModule | None               # wrong-value: the module just after it
    expected: list[np.ndarray] = field(default_factory=list)        # numpy
    before_values: list[np.ndarray] = field(default_factory=list)   # `before`, default_build
    after_values: list[np.ndarray] = field(default_factory=list)    # `after`, default_build
    pipeline_values: list[np.ndarray] = field(default_factory=list) # wrong-value: the whole pipeline
    before_well_formed: bool | None = None
    after_well_formed: bool | None = None
    log: list[str] = field(default_factory=list)


def _one_line(error: BaseException) -> str:
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1] if lines else ''}"


def _describe(values: list[np.ndarray]) -> str:
    return "; ".join(f"{v.dtype}{list(v.shape)} {np.array2string(v.ravel()[:4], precision=5)}" for v in values)


def experiment(name: str) -> Finding:
    """Re-establish the ground truth of ``BUGS[name]`` by hand (see the module docstring)."""
    bug = BUGS[name]
    inputs = bug.inputs()
    expected = [np.asarray(e) for e in bug.expected(inputs)]
    log = [f"{bug.name} ({bug.upstream}): {bug.summary}"]

    # 1. the whole pipeline, as the report ran it, under a recording instrument
    recorder = PassRecorder()
    error, path, pipeline_values = None, None, []
    try:
        with tvm.transform.PassContext(instruments=[recorder]):
            pipeline_values = run_module(bug.build(), inputs, bug.pipeline())
    except Exception as e:  # noqa: BLE001 - the bug under study
        error, path = e, ">".join(recorder.stack)
        log.append(f"pipeline raised {_one_line(error)} with open passes {path}")
    else:
        starts = [p for p in recorder.started if p.split(">")[-1] == bug.guilty_pass]
        path = starts[0] if starts else None
        log.append(f"pipeline compiled; {bug.guilty_pass} started at {path}; "
                   f"values {_describe(pipeline_values)}; numpy {_describe(expected)}; "
                   f"same as numpy: {same_values(pipeline_values, expected)}")

    # 2. by hand: the pipeline's steps one at a time
    mod, steps = bug.build(), bug.steps()
    names = [p.info.name for p in steps]
    log.append(f"steps: {' '.join(names)}" + (f" (with Target({bug.target!r}))" if bug.target else ""))
    finding = Finding(name, "ok", path, error, None, None, names, None, None, expected=expected,
                      pipeline_values=pipeline_values, log=log)
    target = tvm.target.Target(bug.target) if bug.target else None
    for index, (step_name, step) in enumerate(zip(names, steps)):
        before = mod
        try:
            if target is not None:
                with target:
                    mod = step(mod)
            else:
                mod = step(mod)
        except Exception as e:  # noqa: BLE001
            finding.kind, finding.guilty_step, finding.step_error, finding.before = "compile", step_name, e, before
            log.append(f"step {index} {step_name} raised {_one_line(e)}")
            break
        if index < len(steps) - 1 and bug.kind == "wrong-value":
            # a user pass before the build pipeline: finish what it left with default_build and run it
            before_values, after_values = run_module(before, inputs), run_module(mod, inputs)
            log.append(f"before {step_name}: {_describe(before_values)} (same as numpy: "
                       f"{same_values(before_values, expected)}); after: {_describe(after_values)} "
                       f"(same as numpy: {same_values(after_values, expected)})")
            if same_values(before_values, expected) and not same_values(after_values, expected):
                finding.kind, finding.guilty_step = "wrong-value", step_name
                finding.before, finding.after = before, mod
                finding.before_values, finding.after_values = before_values, after_values
                break

    # 3. the module the guilty step received was right: well-formed, and right values by default_build
    if finding.before is not None:
        finding.before_well_formed = relax.analysis.check_well_formed(finding.before)
        if not finding.before_values:
            finding.before_values = run_module(finding.before, inputs)
        log.append(f"module before {finding.guilty_step}: well-formed {finding.before_well_formed}; "
                   f"default_build values {_describe(finding.before_values)}; "
                   f"same as numpy: {same_values(finding.before_values, expected)}")
    if finding.after is not None:
        finding.after_well_formed = relax.analysis.check_well_formed(finding.after)
        log.append(f"module after {finding.guilty_step}: well-formed {finding.after_well_formed}")
    return finding


def module_before(name: str) -> tvm.IRModule:
    """The module the guilty step of ``BUGS[name]`` receives (its steps applied up to it)."""
    bug = BUGS[name]
    mod = bug.build()
    target = tvm.target.Target(bug.target) if bug.target else None
    for step in bug.steps():
        if step.info.name == bug.guilty_pass:
            return mod
        if target is not None:
            with target:
                mod = step(mod)
        else:
            mod = step(mod)
    raise AssertionError(f"{name}: no step {bug.guilty_pass}")


def script_roundtrip(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` printed with its metadata and parsed back, checked structurally equal.

    Only for modules without tensor constants: in TVM 0.27.0.post1 ``mod.script(show_meta=True)``
    segfaults (in ``ToJSONGraph``) when a Relax function holds a tensor constant, and
    ``tvm.ir.save_json`` segfaults on any IR node — see ``tvm_pass_bugs.md`` and
    :func:`constants_roundtrip` for modules with constants.
    """
    assert not has_tensor_constants(mod), "script(show_meta=True) segfaults on tensor constants"
    parsed = tvm.script.from_source(mod.script(show_meta=True))
    tvm.ir.assert_structural_equal(mod, parsed)
    return parsed


def has_tensor_constants(mod: tvm.IRModule) -> bool:
    """Whether some Relax function of ``mod`` holds a non-scalar constant (in TVM 0.27 a
    ``tvm.ir.GenericConst``; scalars print inline as ``R.const(1.5, "float32")``)."""
    found = []

    def visit(expr):
        if isinstance(expr, tvm.ir.GenericConst) and len(expr.value.shape) > 0:
            found.append(expr)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return bool(found)


def lift_constants(mod: tvm.IRModule, func: str = "main") -> tuple[tvm.IRModule, dict]:
    """``mod`` with the tensor constants of ``func`` turned into trailing parameters
    ``const_0, const_1, ...``, and their values by parameter name (for ``relax.transform.BindParams``)."""
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class _Lift(PyExprMutator):
        def __init__(self, module):
            super().__init__(module)
            self.params, self.values = [], {}

        def visit_generic_const_(self, op):
            if len(op.value.shape) == 0:
                return op
            name = f"const_{len(self.params)}"
            var = relax.Var(name, op.ty)
            self.params.append(var)
            self.values[name] = op.value
            return var

    function = mod[func]
    lift = _Lift(mod)
    body = lift.visit_expr(function.body)
    lifted = tvm.IRModule(dict(mod.functions))
    lifted[func] = relax.Function(list(function.params) + lift.params, body, function.ret_ty,
                                  function.is_pure, function.attrs)
    return lifted, lift.values


def constants_roundtrip(mod: tvm.IRModule, func: str = "main") -> tvm.IRModule:
    """The round trip that works with tensor constants: lift them into parameters, print (no
    metadata left), parse, bind them back with ``BindParams``; checked structurally equal."""
    lifted, values = lift_constants(mod, func)
    assert not has_tensor_constants(lifted)
    parsed = tvm.script.from_source(lifted.script(show_meta=True))
    bound = relax.transform.BindParams(func, values)(parsed)
    tvm.ir.assert_structural_equal(mod, bound)
    return bound


def main() -> int:  # python tests/support/tvm_pass_bugs.py: every entry against its ground truth
    failures = 0
    for name, bug in BUGS.items():
        finding = experiment(name)
        print("\n".join(finding.log))
        problems = check(bug, finding)
        print(f"==> {name}: {'OK' if not problems else 'MISMATCH: ' + '; '.join(problems)}\n")
        failures += bool(problems)
    return failures


def check(bug: PassBug, finding: Finding) -> list[str]:
    """The differences between ``bug``'s recorded ground truth and what ``finding`` saw."""
    problems = []
    if finding.kind != bug.kind:
        problems.append(f"kind {finding.kind} != {bug.kind}")
    if finding.guilty_step != bug.guilty_pass:
        problems.append(f"guilty step {finding.guilty_step} != {bug.guilty_pass}")
    if finding.path != bug.pass_path:
        problems.append(f"path {finding.path} != {bug.pass_path}")
    if bug.kind == "compile":
        for label, error in (("pipeline", finding.error), ("step", finding.step_error)):
            if not isinstance(error, bug.error_type) or bug.error_text not in str(error):
                problems.append(f"{label} error {error!r:.200} is not {bug.error_type.__name__}: {bug.error_text}")
    else:
        if finding.error is not None:
            problems.append(f"pipeline raised {finding.error!r:.200}")
        if same_values(finding.pipeline_values, finding.expected):
            problems.append("the whole pipeline gives numpy's values")
        if same_values(finding.after_values, finding.expected):
            problems.append("the module after the pass gives numpy's values")
    if not finding.before_well_formed:
        problems.append("the module before the guilty step is not well-formed")
    if not same_values(finding.before_values, finding.expected):
        problems.append("the module before the guilty step does not give numpy's values")
    return problems


if __name__ == "__main__":
    import sys

    sys.exit(main())
