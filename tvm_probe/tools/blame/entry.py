"""``blame()``: from a model, its inputs and a reference to the stage of TVM responsible.

The order of the questions (each answered by building and running for real):

1. Does TVM's importer take the model?  No: ``importer``.
2. Does the user's pipeline run?  A pass raises: that pass (its nesting path from the pass
   instrument's open before-hooks), or — when it is ``LegalizeOps`` — the op's kernel (TOPI).
3. Does the result build?  No: the kernel that does not (code generation).
4. Does the build run?  A kernel kills the process (run first in a watched child process,
   :func:`tvm_probe.capture.watch.run_watched`): ``runtime-crash``, the kernel and its source ops.
5. Does the build agree with the reference?  Yes: ``none``.  No: the first divergent value *V*.
6. The imported module built unoptimised (``default_build``: legalization and lowering only) —
   is *V* right there?
   * yes: bisect over the pipeline's steps (the module after each, finished with
     ``default_build``) for the first after which *V* (and every output) is wrong: that pass;
     right after every step: the kernel computing *V* in the deployed build.
   * no: ablate — ``default_build`` less one pass at a time; a pass whose absence makes *V*
     right is blamed.  Otherwise the Relax that makes *V* is evaluated independently
     (:mod:`.semantics`) on the reference's values of its inputs: it gives the reference's value
     → the op's ``kernel`` (its PrimFunc is shown); it does not → the ``importer`` wrote Relax that
     means something else.  No independent evaluation of the op: ``undecided``, with why.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from ...build.compile import CALL_GRAPH_PASSES, parse_target, resolve_pipeline, run_pipeline_recorded
from ...build.passes import PassRun, failing_bindings, op_name, single_binding_module
from ...capture.watch import run_watched
from ...comparison.reference import get_reference, is_no_reference, reference_for
from ...comparison.verdict import compare, compare_arrays
from ...core.errors import KernelCrash, ProbeError, TVMError, TVMImportError, one_line
from ...core.inputs import check_inputs
from ...core.schema import DEFAULT_PIPELINE, DEFAULT_TARGET
from ...importer import adapter_for, adapter_of
from ...probe import Probe
from ...probe.verify import values_by_var
from .repro import PassRepro, ValueRepro
from .result import Blame
from .semantics import NoMeaning, meaning

log = logging.getLogger(__package__)

#: What finishes a module of the pipeline so that it can run: legalization and lowering only.
FINISH = "default_build"


def blame(model, inputs=None, reference=None, pipeline=DEFAULT_PIPELINE, target=DEFAULT_TARGET, *,
          kind: str | None = None, **options) -> Blame:
    """Which stage of TVM is responsible when ``model`` fails or diverges (see the module docstring).

    Args:
        model: what :meth:`Probe.from_model` takes — an ONNX model or path, ``(torch module,
            example inputs)``, a TFLite model, a Relax IRModule — or a :class:`Probe` (then
            ``reference`` must be the expected values).
        inputs: as :meth:`Probe.run` takes them (``{input name: array}``, a list, or None for a
            model that declares its inputs' example values).
        reference: a reference name (``"onnxruntime"``, ``"torch"``, ``"tflite"``) or the expected
            values ``{source name: array}`` (the model's outputs at least).  Default: the model
            kind's reference; for a Relax module, the module itself built with ``default_build``.
        pipeline, target: the build that fails, as for :meth:`Probe.from_onnx`.
        kind: the model kind, when it cannot be told from the object.
        options: what the kind's import takes (``shapes=``, ``params=``...).

    Returns:
        A :class:`Blame`.  It never raises on the model's own failure: a failing model is what it
        explains.

    Raises:
        ProbeError: the arguments are wrong (an unknown pipeline, inputs that do not fit), or the
            reference cannot run the model.
    """
    return _Blamer(target, pipeline).blame(model, inputs, reference, kind, options)


@dataclass
class _Imported:
    imported: Any
    source: Any        # what the reference runs (None for a probe)
    kind: str


class _Blamer:
    """One blame: the build settings, the clock and the count of builds."""

    def __init__(self, target, pipeline):
        self.given_target = target
        self.target = parse_target(target)
        resolve_pipeline(pipeline, self.target)  # an unknown pipeline is the caller's error, said now
        self.pipeline = pipeline
        self.builds = 0
        self.start = time.perf_counter()

    def done(self, blame: Blame) -> Blame:
        blame.builds, blame.seconds = self.builds, time.perf_counter() - self.start
        blame.target = self.given_target
        log.info("%s", blame.headline())
        return blame

    # ------------------------------------------------------------------ the questions in order
    def blame(self, model, inputs, reference, kind, options) -> Blame:
        try:
            model_ = self._import(model, kind, options)
        except TVMImportError as err:
            return self.done(Blame("importer", "compile", evidence=[f"TVM's importer fails on the model: {err}"]))
        imported = model_.imported
        record = run_pipeline_recorded(imported.mod, self.target, self.pipeline)
        self.builds += 1
        if record.failed:
            return self.done(self._pass_failure(record, imported))
        try:
            probe = Probe.from_imported(imported, self.target, self.pipeline)
        except TVMError as err:
            return self.done(self._build_failure(err))
        self.builds += 1
        arrays = check_inputs(imported.inputs, inputs, allow_nonfinite=True) if imported.inputs else []
        try:  # in a watched child first: a kernel that kills the process is named, this one goes on
            run_watched(probe.run, arrays, capture="all", allow_nonfinite=True)
        except KernelCrash as crash:
            return self.done(Blame("runtime-crash", "crash", kernel=crash.kernel,
                                   value=crash.keys[0] if crash.keys else None, evidence=[one_line(crash)]))
        except TVMError:
            pass  # said by the run below, in this process
        try:
            outputs = probe.run(arrays, capture="all", allow_nonfinite=True)
        except TVMError as err:
            failure = getattr(err, "failure", None)
            return self.done(Blame("kernel", "run", kernel=(failure.kernels[0] if failure and failure.kernels else None),
                                   evidence=[f"the deployed build fails to run: {one_line(err)}"]))
        expected = self._reference(model_, reference, arrays)
        divergence = self._first_divergence(probe, outputs, expected, arrays)
        if isinstance(divergence, str):
            return self.done(Blame("none", "", evidence=[divergence]))
        return self.done(self._divergence(divergence, imported, record, probe))

    def _first_divergence(self, probe, outputs, expected, arrays) -> "_Divergence | str":
        """The first value out of tolerance (in source order; else the first model output that is),
        or what was compared when none is."""
        comparison = compare(probe, expected)
        first = comparison.first_divergent
        if first is not None:
            return _Divergence(first.key, first.name, expected, arrays, probe.get_tensor(first.key), list(outputs))
        compared = 0
        for name, value in outputs.items():
            if name in expected and not isinstance(value, list):
                compared += 1
                if not compare_arrays(name, name, "", np.asarray(value), np.asarray(expected[name])).passed:
                    return _Divergence(name, name, expected, arrays, np.asarray(value), list(outputs))
        if not compared and not comparison.values:
            raise ProbeError("blame compared nothing: the reference gives none of the model's outputs "
                             f"({', '.join(outputs)}); give reference= the expected outputs by these names")
        return f"TVM agrees with the reference: {comparison.verdict()}; {compared} model outputs within tolerance"

    def _import(self, model, kind, options) -> _Imported:
        if isinstance(model, Probe):
            return _Imported(model.imported, None, "probe")
        adapter = adapter_for(kind) if kind is not None else adapter_of(model)
        if not adapter.functions:
            return _Imported(adapter.import_model(model, **options), model, adapter.kind)
        functions = adapter.import_functions(model, **options)
        if list(functions.models) != ["main"]:
            raise ProbeError(f"blame runs a module's main function alone; this one exposes "
                             f"{', '.join(functions.models) or 'none'}: give a module whose entry point is main")
        return _Imported(functions.models["main"], model, adapter.kind)

    def _reference(self, model_: _Imported, reference, arrays) -> Mapping[str, np.ndarray]:
        if isinstance(reference, Mapping):
            return {k: np.asarray(v) for k, v in reference.items()}
        imported = model_.imported
        if reference is None and model_.kind == "relax":
            values, returned = values_by_var(imported, imported.mod, arrays, self.target, FINISH)
            self.builds += 1
            return {**values, **imported.sources.output_values(returned)}
        if model_.source is None:
            raise ProbeError("blame of a Probe needs reference= as the expected values {source name: array}: "
                             "the probe does not keep the source model a reference would run")
        if is_no_reference(reference or ""):
            raise ProbeError("blame needs a reference to tell a wrong value: give reference= a name or the expected values")
        ref = reference_for(model_.kind) if reference is None else (
            reference if hasattr(reference, "values") else get_reference(reference))
        named = dict(zip([s.name for s in imported.inputs], arrays))
        return ref.values(model_.source, named)

    # ------------------------------------------------------------------ failures while compiling
    def _pass_failure(self, record, imported) -> Blame:
        run = record.failing
        step = _step_of(run)
        inner = f" (inside it: {run.path})" if run is not step else ""
        words = f"{record.error_type}: {record.message}"
        if step.name == "LegalizeOps":
            return self._legalization_failure(record, step, words, imported)
        blame = Blame("pass", "compile", pass_name=step.name, pass_path=step.path,
                      evidence=[f"{step.name} raises {words}", f"where it ran: {step.path}{inner}"])
        blame.repro = PassRepro.for_failure(record, step, imported)
        return blame

    def _legalization_failure(self, record, step: PassRun, words: str, imported) -> Blame:
        found = failing_bindings(step, record.target, record.error)
        ops = sorted({b.op for b in found or ()})
        op = ", ".join(ops) or "an op"
        keys = [k for b in found or () for k in imported.var_keys.get(b.var, ())]
        blame = Blame("kernel", "compile", value=keys[0] if keys else None, pass_name=step.name,
                      pass_path=step.path, kernel=op,
                      evidence=[f"LegalizeOps (the ops' TOPI kernels) raises {words}",
                                f"the op that fails alone: {op}" if ops else "no single op fails alone"])
        blame.repro = PassRepro.for_failure(record, step, None)
        return blame

    def _build_failure(self, err) -> Blame:
        failure = getattr(err, "failure", None)
        kernels = ", ".join(failure.kernels) if failure is not None and failure.kernels else None
        return Blame("kernel", "compile", kernel=kernels,
                     evidence=[f"code generation fails: {one_line(err)}"])

    # ------------------------------------------------------------------ a wrong value
    def _divergence(self, div: "_Divergence", imported, record, probe) -> Blame:
        head = f"first divergent value: {div.name} ({div.describe()})"
        right_as_imported = self._right(imported.mod, imported, div)[0]
        div.unfused = dict(div.last_values)
        if not right_as_imported:
            return self._wrong_as_imported(div, imported, record, head)
        steps = [s for s in record.passes.steps() if s.result is not None]
        end = next((i for i, s in enumerate(steps) if s.name in CALL_GRAPH_PASSES), len(steps))
        found = self._bisect(steps[:end], imported, div)
        if found is None:
            return self._deployed_kernel(div, probe, head)
        if isinstance(found, str):
            return Blame("undecided", "divergence", value=div.name, evidence=[head, found])
        step, after = found
        blame = Blame("pass", "divergence", value=div.name, pass_name=step.name, pass_path=step.path,
                      evidence=[head, f"right in the module before {step.name}, wrong after it ({after})",
                                f"where it ran: {step.path}"])
        blame.repro = ValueRepro.for_pass(step, div)
        return blame

    def _bisect(self, steps: list[PassRun], imported, div) -> tuple[PassRun, str] | str | None:
        """The first step after which the value is wrong (the module before the first is right,
        the deployed build wrong): the step and what differs; None when every step's module is
        right; why not, when the steps around the change cannot be built alone."""
        lo, hi, why = -1, len(steps), ""
        known: dict[int, bool | None] = {}
        while hi - lo > 1:
            mid = (lo + hi) // 2
            at = next((i for i in [mid, *range(mid + 1, hi), *range(mid - 1, lo, -1)] if i not in known), None)
            if at is None:
                break
            try:
                right, detail = self._right(steps[at].result, imported, div)
            except TVMError as err:  # a module halfway through a pipeline may not build alone
                log.info("the module after %s does not build with %s: %s", steps[at].name, FINISH, err)
                known[at] = None
                continue
            known[at] = right
            if right:
                lo = at
            else:
                hi, why = at, detail
        if hi - lo > 1:
            names = ", ".join(s.name for s in steps[lo + 1:hi + 1])
            return (f"right after {steps[lo].name if lo >= 0 else 'import'}, wrong after "
                    f"{steps[hi].name if hi < len(steps) else 'the deployed build'}; the modules between ({names}) "
                    f"cannot be built with {FINISH} alone, so no single pass can be named")
        return None if hi == len(steps) else (steps[hi], why)

    def _right(self, mod, imported, div, finish=FINISH) -> tuple[bool, str]:
        """Whether ``mod`` finished with ``finish`` computes the value and every output the
        reference has within tolerance; when not, what differs."""
        values, returned = values_by_var(imported, mod, div.arrays, self.target, finish)
        self.builds += 1
        values = {**values, **imported.sources.output_values(returned)}
        div.last_values = values
        for key in [div.key, *[k for k in imported.sources.output_values(returned) if k != div.key]]:
            if key in values and key in div.expected:
                cmp = compare_arrays(key, key, "", np.asarray(values[key]), np.asarray(div.expected[key]))
                if not cmp.passed:
                    return False, f"{key}: {cmp.describe()}"
        return True, ""

    def _wrong_as_imported(self, div, imported, record, head) -> Blame:
        ablated = self._ablate(imported, div)
        if ablated is not None:
            step = next((s for s in record.passes.steps() if s.name == ablated), None)
            path = step.path if step is not None else f"{FINISH}>sequential>{ablated}"
            return Blame("pass", "divergence", value=div.name, pass_name=ablated, pass_path=path,
                         evidence=[head, f"wrong in the imported module built with {FINISH}; right without its "
                                         f"{ablated}"])
        return self._importer_or_kernel(div, imported, head)

    def _ablate(self, imported, div) -> str | None:
        """The pass of :data:`FINISH` without which the imported module computes the value right
        (only those it can do without: :data:`_OPTIONAL_FINISH_PASSES`)."""
        import tvm
        from tvm import relax

        for name in _OPTIONAL_FINISH_PASSES:
            passes = [getattr(relax.transform, n)() for n in _FINISH_PASSES if n != name]
            try:
                right, _ = self._right(imported.mod, imported, div, tvm.transform.Sequential(passes))
            except (TVMError, ProbeError):
                continue  # the build needs that pass
            if right:
                return name
        return None

    def _importer_or_kernel(self, div, imported, head) -> Blame:
        """The imported module, built unoptimised, computes the value wrong: the importer's Relax
        or TVM's kernel for it?  Three values decide: the reference's (R), TVM's unfused (T) and
        what the Relax means (M, :mod:`.semantics`, from the reference's inputs)."""
        var, binding = _binding_of(imported, div.key)
        if var is None:
            return self._computed_while_importing(div, imported, head)
        shape = _static_shape(var)
        want = np.asarray(div.expected[div.key]).shape
        if shape is not None and tuple(shape) != tuple(want):
            return Blame("importer", "divergence", value=div.name,
                         evidence=[head, f"the imported module declares it {list(shape)}; the reference's is "
                                         f"{list(want)}: the importer already wrote another shape"])
        op = op_name(binding.value)
        if op == "relax.call_tir":
            kernel = binding.value.args[0].name_hint
            blame = Blame("kernel", "divergence", value=div.name, kernel=kernel,
                          evidence=[head, f"the importer calls TVM's kernel {kernel} itself (call_tir): no Relax op "
                                          "stands between the source op and the kernel that computes it wrong"])
            blame.primfunc = imported.mod[kernel].script()
            return blame
        try:
            relax_value = _evaluate(binding.value, imported, div, {})
        except NoMeaning as why:
            return Blame("undecided", "divergence", value=div.name,
                         evidence=[head, "the imported module, built unoptimised, already computes it wrong; "
                                         f"whether the importer or the op's kernel is wrong is unknown: {why}"])
        reference = np.asarray(div.expected[div.key])
        meant = np.asarray(relax_value).astype(reference.dtype, copy=False)
        by_reference = compare_arrays(div.key, div.name, "", meant, reference)
        unfused = div.unfused.get(div.key)
        by_tvm = compare_arrays(div.key, div.name, "", np.asarray(unfused), meant) if unfused is not None else None
        meaning_of = f"the Relax the importer wrote ({op}), evaluated with numpy on the reference's inputs,"
        if not by_reference.passed and by_tvm is not None and by_tvm.passed:
            return Blame("importer", "divergence", value=div.name,
                         evidence=[head, f"{meaning_of} gives TVM's value, not the reference's "
                                         f"({by_reference.describe()}): the Relax means something else than the "
                                         "source op"])
        blame = Blame("kernel", "divergence", value=div.name, kernel=op,
                      evidence=[head, f"{meaning_of} gives "
                                      + ("the reference's value" if by_reference.passed else
                                         f"neither the reference's ({by_reference.describe()}) nor TVM's")
                                      + "; TVM's kernel for it computes otherwise"
                                      + (f" ({by_tvm.describe()} against what the Relax means)" if by_tvm else "")])
        blame.primfunc = _legalized(imported.mod, binding)
        return blame

    @staticmethod
    def _computed_while_importing(div, imported, head) -> Blame:
        """A value the imported module binds to no Var: a constant or shape the importer computed."""
        if div.key in imported.constants:
            what = f"as the constant {_short(imported.constants[div.key])}"
        elif div.key in imported.shape_values:
            what = f"as the shape expression {imported.shape_values[div.key]}"
        else:
            return Blame("undecided", "divergence", value=div.name,
                         evidence=[head, "the imported module binds it to no Var: where it is computed is unknown"])
        return Blame("importer", "divergence", value=div.name,
                     evidence=[head, f"the importer computed it while importing, {what} (the reference: "
                                     f"{_short(div.expected[div.key])}): no kernel or pass of TVM computes it"])

    def _deployed_kernel(self, div, probe, head) -> Blame:
        site = probe.kernel_map.site_of(div.key)
        symbol = probe.kernel_map.sites[site].symbol if site is not None else None
        blame = Blame("kernel", "divergence", value=div.name, kernel=symbol,
                      evidence=[head, f"right in the module after every pass of the pipeline (each built with "
                                      f"{FINISH}), wrong in the deployed build" +
                                      (f", computed by its kernel {symbol}" if symbol else "")])
        final = probe.built.snapshots.final
        if symbol is not None and any(gv.name_hint == symbol for gv in final.functions):
            blame.primfunc = final[symbol].script()
        return blame


_FINISH_PASSES = ("LegalizeOps", "RewriteDataflowReshape", "ToNonDataflow", "RemovePurityChecking",
                  "CallTIRRewrite", "StaticPlanBlockMemory", "RewriteCUDAGraph", "LowerAllocTensor",
                  "KillAfterLastUse", "LowerRuntimeBuiltin", "ComputePrimValue", "VMShapeLower",
                  "AttachGlobalSymbol")
#: The passes of :data:`FINISH` a module still builds and runs without (the others lower what
#: the VM cannot run: leaving one out fails the build).
_OPTIONAL_FINISH_PASSES = ("RewriteDataflowReshape", "StaticPlanBlockMemory", "RewriteCUDAGraph", "KillAfterLastUse")


@dataclass
class _Divergence:
    key: str
    name: str
    expected: Mapping[str, np.ndarray]
    arrays: list
    got: np.ndarray
    outputs: list[str]               # the model's outputs, in the order main returns them
    last_values: dict | None = None  # what the last module checked computed
    unfused: dict | None = None      # what the imported module built unoptimised computed

    def describe(self) -> str:
        cmp = compare_arrays(self.key, self.name, "", np.asarray(self.got), np.asarray(self.expected[self.key]))
        return cmp.describe()


def _step_of(run: PassRun) -> PassRun:
    """The pipeline step ``run`` ran inside (itself when it is one)."""
    while run.parent is not None and run.parent.name != "sequential":
        run = run.parent
    return run


def _binding_of(imported, key: str):
    """The Var of the imported ``main`` tagged with ``key`` and its binding (None, None: no Var)."""
    var = next((v for v, keys in imported.var_keys.items() if key in keys), None)
    return (None, None) if var is None else _binding_by_var(imported, var)


def _static_shape(var):
    shape = getattr(var.ty, "shape", None)
    values = getattr(shape, "values", None)
    if values is None or not all(hasattr(v, "value") for v in values):
        return None
    return [int(v.value) for v in values]


def _evaluate(expr, imported, div, seen: dict):
    """``expr`` of the imported module evaluated with :mod:`.semantics`: a Var that is a source
    value takes the reference's value, a parameter the input, a constant its data."""
    import tvm
    from tvm import relax

    if isinstance(expr, tvm.ir.expr.GenericConst):
        return expr.value.numpy()
    if isinstance(expr, relax.Var):
        keys = imported.var_keys.get(expr, ())
        known = next((div.expected[k] for k in keys if k in div.expected), None)
        if known is not None:
            return np.asarray(known)
        params = list(imported.mod["main"].params)
        index = next((i for i, p in enumerate(params) if p.same_as(expr)), None)
        if index is not None:
            return np.asarray(div.arrays[index])
        if expr in seen:
            return seen[expr]
        _, binding = _binding_by_var(imported, expr)
        if binding is None:
            raise NoMeaning(f"the value of {expr.name} is not known")
        seen[expr] = _evaluate(binding.value, imported, div, seen)
        return seen[expr]
    if isinstance(expr, relax.Tuple):
        return [_evaluate(f, imported, div, seen) for f in expr.fields]
    if isinstance(expr, relax.Call):
        args = [_evaluate(a, imported, div, seen) if isinstance(a, (relax.Var, relax.Tuple, tvm.ir.expr.GenericConst))
                else None for a in expr.args]  # shapes and scalars: the meaning reads them from the call
        return meaning(expr, args)
    raise NoMeaning(f"no independent evaluation of {type(expr).__name__}")


def _binding_by_var(imported, var):
    for block in imported.mod["main"].body.blocks:
        for binding in block.bindings:
            if binding.var.same_as(var):
                return var, binding
    return None, None


def _short(value) -> str:
    """A value in a few characters (a constant in the evidence)."""
    return np.array2string(np.asarray(value), threshold=8, precision=4, separator=", ")


def _legalized(mod, binding) -> str | None:
    """The PrimFunc(s) LegalizeOps writes for ``binding`` alone, as TVMScript."""
    import tvm
    from tvm import relax

    try:
        small = single_binding_module(mod, binding, dataflow=True, is_pure=True)
        legal = relax.transform.LegalizeOps()(small)
    except Exception as err:  # the legalization itself may be what fails
        return f"# LegalizeOps of this op fails: {one_line(err)}"
    funcs = [f for _, f in legal.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    return "\n".join(f.script() for f in funcs) or None
