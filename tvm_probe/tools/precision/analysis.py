"""Local against inherited error of every source op of a reduced-precision build (see :mod:`tvm_probe.tools.precision`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...build.precision import op_slice
from ...core.device import device_for
from ...core.errors import ProbeError, one_line
from ...core.metrics import both_finite
from ...core.metrics import error_stats as stats_of
from ...core.native_log import native_log_to_logging
from ...core.precision import PrecisionError
from ...core.sources import Kind


@dataclass
class OpError:
    """One source op of a reduced-precision build, against the fp32 build.

    Errors are *normalized*: the largest absolute difference over the elements both sides hold as
    finite numbers, divided by the largest magnitude of the fp32 value; ``inf`` when the op
    creates an infinity or NaN the fp32 value does not have; NaN when it could not be measured
    (``note`` says why).

    Attributes:
        key, name, op_type: the source value and its op.
        dtype: the dtype the reduced build holds it in.
        local: error of the op alone (its slice fed the fp32 run's values in the reduced dtypes).
        inherited: error of the reduced build's value (everything before it included).
        local_max_abs, inherited_max_abs: the same as absolute differences.
        local_inf, local_nan, local_zero: elements the op alone turns into ±inf, NaN, or 0
            (underflow: flushed to zero) where the fp32 value is finite / a number / nonzero.
        inf, nan, zero: the same counts in the reduced build's value.
    """

    key: str
    name: str
    op_type: str
    dtype: str
    local: float = float("nan")
    inherited: float = float("nan")
    local_max_abs: float = float("nan")
    inherited_max_abs: float = float("nan")
    local_inf: int = 0
    local_nan: int = 0
    local_zero: int = 0
    inf: int = 0
    nan: int = 0
    zero: int = 0
    note: str = ""


@dataclass
class PrecisionAnalysis:
    """Every source op of a reduced build, ranked by local error (largest first; unmeasured last)."""

    ops: list[OpError]
    dtype: str = "float16"

    def table(self):
        """DataFrame: one row per op, in ranking order, with its ``rank`` (1 = worst)."""
        import pandas as pd

        rows = [{"rank": i + 1, **op.__dict__} for i, op in enumerate(self.ops)]
        return pd.DataFrame(rows, columns=["rank"] + list(OpError.__dataclass_fields__))

    def ranking(self) -> list[str]:
        """Display names of the ops whose local error is above zero, worst first."""
        return [op.name for op in self.ops if op.local > 0]

    def overflowing(self) -> list[str]:
        """Display names of the ops whose own low-precision result has new inf/NaN."""
        return [op.name for op in self.ops if op.local_inf or op.local_nan]

    def summary(self, n: int = 5) -> str:
        shown = "; ".join(f"{op.name} ({_describe(op)})" for op in self.ops[:n] if op.local > 0)
        return f"ops ranked by local error in {self.dtype}: " + (shown or "no op adds error by itself")


def _describe(op: OpError) -> str:
    counts = ", ".join(f"{n} {what}" for what, n in (("inf", op.local_inf), ("NaN", op.local_nan),
                                                   ("flushed to 0", op.local_zero)) if n)
    return f"local {op.local:.3g}" + (f", {counts}" if counts else "") + f", inherited {op.inherited:.3g}"


def error_stats(low: np.ndarray, ref: np.ndarray) -> tuple[float, float, int, int, int]:
    """(normalized error, max abs error, new inf, new NaN, flushed to zero) of ``low`` against ``ref``.

    The max abs error is :func:`tvm_probe.core.metrics.error_stats`'s over the elements finite on both
    sides (``finite_max_abs``); normalized, it is divided by the largest such ``|ref|``.  Unlike the
    symmetric rule of :mod:`tvm_probe.core.metrics`, only what the reduced build *creates* makes it inf:
    inf / NaN where ``ref`` is finite / a number (a reduced value that is finite where fp32
    overflowed is not this op's new error)."""

    lo, rf = np.asarray(low, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    stats = stats_of(lo, rf)
    if stats.shape_mismatch:
        return float("inf"), float("inf"), 0, 0, 0
    inf = int((np.isinf(lo) & np.isfinite(rf)).sum())
    nan = int((np.isnan(lo) & ~np.isnan(rf)).sum())
    zero = int(((lo == 0) & (rf != 0) & np.isfinite(rf)).sum())
    max_abs = stats.finite_max_abs
    scale = float(np.abs(rf[both_finite(lo, rf)]).max()) if stats.finite else 0.0
    norm = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    if inf or nan:
        norm = float("inf")
    return norm, max_abs, inf, nan, zero


def analyse(low_probe, fp32_probe) -> PrecisionAnalysis:
    """Local and inherited error of every source op of ``low_probe`` (a reduced-precision probe)
    against ``fp32_probe`` (the same model in fp32); both must have run on the same inputs.

    See the module docstring for what local and inherited mean.  The slices of every op are
    compiled into one module for the low probe's target and run on this machine.
    """

    if low_probe.precision is None:
        raise PrecisionError("analyse() needs a probe built with precision=...: the first argument is fp32")
    ops = []
    cuts = _Cuts(low_probe, fp32_probe)
    for value in low_probe.sources_map:
        if value.kind is not Kind.VALUE or value.dtype is None or not str(value.dtype).startswith("float"):
            continue
        op = OpError(key=value.key, name=value.display_name, op_type=value.op_type, dtype=str(value.dtype))
        try:
            low, ref = low_probe.get_tensor(value.key), fp32_probe.get_tensor(value.key)
        except ProbeError as err:
            op.note = f"not served: {one_line(err)}"
            ops.append(op)
            continue
        op.inherited, op.inherited_max_abs, op.inf, op.nan, op.zero = error_stats(low, ref)
        cuts.add(op)
        ops.append(op)
    cuts.evaluate()
    ops.sort(key=lambda o: (np.isnan(o.local), -o.local if not np.isnan(o.local) else 0.0))
    return PrecisionAnalysis(ops=ops, dtype=low_probe.precision.spec.dtype)


class _Cuts:
    """The slice of each op in the reduced and the fp32 module, as functions of the tagged
    values it reads, all built in one module (see the module docstring)."""

    def __init__(self, low_probe, fp32_probe):
        self.low, self.ref = low_probe, fp32_probe
        self.low_var = _var_of(low_probe.imported.var_keys)
        self.ref_var = _var_of(fp32_probe.imported.var_keys)
        self.low_keys = {v: ks for v, ks in low_probe.imported.var_keys.items()}
        self.ref_keys = {v: ks for v, ks in fp32_probe.imported.var_keys.items()}
        self.jobs: list[tuple[OpError, Any, Any, list, list]] = []
        self.seen: set = set()

    def add(self, op: OpError) -> None:
        low_var, ref_var = self.low_var.get(op.key), self.ref_var.get(op.key)
        if low_var is None or ref_var is None:
            op.note = "no Relax value for it in one of the two modules"
            return
        if low_var in self.seen:  # an identity of an earlier op: the same value, already measured
            op.local, op.note = 0.0, "the same value as an earlier op (identity)"
            return
        self.seen.add(low_var)
        try:
            low_fn, low_in = _slice_function(self.low.imported.mod["main"], low_var, self.low_keys)
            ref_fn, ref_in = _slice_function(self.ref.imported.mod["main"], ref_var, self.ref_keys)
        except _Unsliceable as err:
            op.note = str(err)
            return
        if low_fn is None or ref_fn is None:
            op.local, op.note = 0.0, "computes nothing itself (an alias of its input)"
            return
        self.jobs.append((op, low_fn, ref_fn, low_in, ref_in))

    def evaluate(self) -> None:
        """Build every slice in one module, feed each the fp32 run's values, fill ``local``."""
        if not self.jobs:
            return
        vm = self._build()
        for i, (op, _, _, low_in, ref_in) in enumerate(self.jobs):
            try:
                low_feed = {k: _cast(self.ref.get_tensor(k), dt) for k, dt in low_in}
                # the fp32 slice reads the same values, rounded as the reduced module holds them
                ref_feed = [_cast(low_feed[k] if k in low_feed else self.ref.get_tensor(k), dt) for k, dt in ref_in]
            except ProbeError as err:
                op.note = f"its inputs are not served by the fp32 run: {one_line(err)}"
                continue
            overflowing = [k for k, _ in low_in if _overflows(self.ref.get_tensor(k), low_feed[k])]
            if overflowing:
                op.note = (f"its input {self.ref.sources_map[overflowing[0]].display_name} already overflows "
                           f"{op.dtype}: the producer's result, not this op's")
                continue
            if vm is None:
                op.note = self.build_error
                continue
            low_out = self._run(vm, f"low{i}", [low_feed[k] for k, _ in low_in])
            ref_out = self._run(vm, f"ref{i}", ref_feed)
            op.local, op.local_max_abs, op.local_inf, op.local_nan, op.local_zero = error_stats(low_out, ref_out)

    def _build(self):
        import tvm
        from tvm import relax


        funcs = {}
        for i, (_, low_fn, ref_fn, _, _) in enumerate(self.jobs):
            funcs[f"low{i}"], funcs[f"ref{i}"] = low_fn, ref_fn
        mod = tvm.IRModule(funcs)
        for source in (self.low.imported.mod, self.ref.imported.mod):
            for gvar, func in source.functions.items():
                if not isinstance(func, relax.Function) and gvar.name_hint not in [g.name_hint for g in mod.get_global_vars()]:
                    mod[gvar] = func
        target = self.low.built.target
        self.device = device_for(target)
        try:
            with native_log_to_logging():
                ex = tvm.compile(mod, target)
        except Exception as err:  # noqa: BLE001 - then every op is unmeasured, with TVM's words
            self.build_error = f"its slices do not build ({one_line(err)})"
            return None
        return relax.VirtualMachine(ex, self.device)

    def _run(self, vm, name: str, arrays: list[np.ndarray]) -> np.ndarray:
        import tvm

        return vm[name](*[tvm.runtime.tensor(a, self.device) for a in arrays]).numpy()


def _var_of(var_keys) -> dict:
    out = {}
    for var, keys in var_keys.items():
        for key in keys:
            out.setdefault(key, var)
    return out


def _cast(array: np.ndarray, dtype: str) -> np.ndarray:
    array = np.asarray(array)
    if not dtype or str(array.dtype) == dtype:
        return array
    with np.errstate(over="ignore"):
        return array.astype(dtype)


def _overflows(fp32: np.ndarray, low: np.ndarray) -> bool:
    a, b = np.asarray(fp32), np.asarray(low)
    if a.dtype.kind != "f":
        return False
    return bool((np.isfinite(a) & ~np.isfinite(b.astype(np.float64))).any())


class _Unsliceable(Exception):
    """An op whose slice reads something other than source values (its local error is unmeasured)."""


def _slice_function(main, out_var, var_keys):
    """The function computing ``out_var`` from the tagged values (and parameters) its op reads,
    and ``[(key, dtype)]`` of its parameters; (None, []) when it computes nothing itself."""
    from tvm import relax

    bindings = op_slice(main, [out_var], set(var_keys))
    if not bindings:
        return None, []
    bound = {b.var for b in bindings}
    reads = []
    for b in bindings:
        for v in relax.analysis.free_vars(b.value):
            if v not in bound and v not in reads:
                reads.append(v)
    inputs, binds = [], []
    for j, var in enumerate(reads):
        keys = var_keys.get(var)
        if not keys:
            raise _Unsliceable(f"its slice reads {var.name}, which holds no source value: no local error")
        param = relax.Var(f"in{j}", var.ty)
        inputs.append((param, keys[0], str(getattr(var.ty, "dtype", ""))))
        binds.append(relax.VarBinding(var, param))
    out = relax.Var("out", out_var.ty)
    block = relax.DataflowBlock(binds + bindings + [relax.VarBinding(out, out_var)])
    func = relax.Function([p for p, _, _ in inputs], relax.SeqExpr([block], out), out_var.ty)
    return func, [(k, dt) for _, k, dt in inputs]
