"""Self-check: every value a probe serves, against an independent evaluation of the same model.

The independent evaluation builds the *imported* module again with TVM's unfused generic
pipeline (``relax.get_pipeline("default")`` for ``llvm``: LegalizeOps and lowering, no
FoldConstant, no FuseOps), so every source value is the output of its own kernel call, found by
plain Var identity — none of the kernel map's machinery (value numbering, per-call-site
replay, recomputation, folding) is involved.  Running it captures every value.

A served value that disagrees with it means tvm_probe named the wrong tensor (or TVM's fused
kernels compute something other than its unfused ones): either way it is reported as a
tvm_probe problem, never as a divergence of TVM from a reference.  Cost: one extra compile and
one unfused run.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from ..capture.executor import CapturePlan, DebugExecutor
from ..comparison.verdict import compare_arrays
from ..core.sources import Kind, Served
from ..core.schema import DEFAULT_TARGET
from ..diagnose import compile_with_snapshots
from ..kernel_map import KernelMap, branch_calls, call_sites, helper_symbols, subroutines

log = logging.getLogger(__name__)
_NOT_COMPUTED = ", not computed by TVM"


@dataclass
class Mismatch:
    """A served value that differs from the independent evaluation."""

    key: str
    name: str
    served: str
    detail: str


@dataclass
class Verification:
    """What :func:`verify` found; truthy when no served value disagreed.

    Attributes:
        checked: how many served values were compared with the independent evaluation.
        mismatches: the values that disagreed (tvm_probe problems).
        unchecked: key → why it could not be compared (e.g. a constant of the source model).
    """

    checked: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    unchecked: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return not self.mismatches

    def summary(self) -> str:
        """One line: how many values were checked and, if any disagreed, the first one."""
        if not self.mismatches:
            constants = sum(why.endswith(_NOT_COMPUTED) for why in self.unchecked.values())
            parts = [f"{constants} inputs, weights and constants of the source model"] if constants else []
            if len(self.unchecked) > constants:
                parts.append(f"{len(self.unchecked) - constants} values not served or not in the unfused build")
            extra = f"; not checked: {', '.join(parts)}" if parts else ""
            return f"verified: all {self.checked} served values equal an independent unfused evaluation{extra}"
        first = self.mismatches[0]
        return (f"tvm_probe problem: {len(self.mismatches)} of {self.checked} served values differ from an "
                f"independent unfused evaluation of the same module; first {first.name!r} "
                f"(served as {first.served}): {first.detail}. Please report this with the model")


def verify(probe, inputs) -> Verification:
    """Run ``probe`` on ``inputs`` and check every value it serves (see module docstring)."""
    probe.run(inputs, capture="all")
    reference = independent_values(probe.imported, probe.last_inputs)
    out = Verification()
    for value in probe.sources_map:
        if value.kind is not Kind.VALUE:
            out.unchecked[value.key] = f"a {value.kind.value} of the source model{_NOT_COMPUTED}"
            continue
        served = probe.servings[value.key].served
        if served in (Served.UNAVAILABLE, Served.UNKNOWN):
            out.unchecked[value.key] = f"not served ({served.value})"
            continue
        if served is Served.SEQUENCE:
            out.unchecked[value.key] = "a sequence: its elements are checked, each a value of its own"
            continue
        if value.key not in reference:
            out.unchecked[value.key] = "the unfused build holds no run-time value for it"
            continue
        out.checked += 1
        problem = _difference(probe.get_tensor(value.key), reference[value.key])
        if problem:
            out.mismatches.append(Mismatch(value.key, value.display_name, served.value, problem))
    log.info(out.summary())
    return out


def _difference(got: np.ndarray, ref: np.ndarray) -> str:
    """'' when ``got`` equals ``ref`` within the dtype's default tolerance, else what differs (in
    the words of :mod:`tvm_probe.comparison`)."""
    got, ref = np.asarray(got), np.asarray(ref)
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return f"{got.dtype}{list(got.shape)} served, {ref.dtype}{list(ref.shape)} computed"
    cmp = compare_arrays("", "", "", got, ref)
    return "" if cmp.passed else cmp.describe()


def independent_values(imported, arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Every source value the unfused build computes from ``arrays`` (the model inputs, in order),
    by source key: built for llvm, found by Var identity."""
    from tvm import relax

    return values_by_var(imported, imported.mod, arrays, DEFAULT_TARGET, relax.get_pipeline("default"))[0]


def values_by_var(imported, mod, arrays: list[np.ndarray], target, pipeline) -> tuple[dict[str, np.ndarray], object]:
    """``mod`` — the imported module, or one a pass of a pipeline made from it — built with
    ``pipeline`` for ``target`` and run on ``arrays``: the source values it computes whose Vars it
    still binds (Var identity), by source key, and what ``main`` returned (as numpy)."""
    built = compile_with_snapshots(mod, target, pipeline)
    main = built.snapshots.call_graph["main"]
    functions = subroutines(built.snapshots.call_graph)
    calls = call_sites(main, functions)
    params = {p: i for i, p in enumerate(main.params)}
    kmap = KernelMap(sites=calls.sites, helper_symbols=helper_symbols(built.snapshots),
                     branches=branch_calls(main, functions))
    capture = DebugExecutor(built, kmap).run(arrays, CapturePlan())
    values = {}
    for var, keys in imported.var_keys.items():
        if var in calls.produced:
            out = calls.produced[var]
            array = capture.outputs[out.site][out.output]
        elif var in params:
            array = arrays[params[var]]
        else:
            continue
        for key in keys:
            values.setdefault(key, array)
        _sequence_elements(values, keys, imported.sources.sequences, calls, capture, var)
    return values, capture.result


def _sequence_elements(values: dict, keys, sequences: dict, calls, capture, var) -> None:
    """The elements of a sequence whose Var is a kernel's tuple of outputs (SplitToSequence):
    element ``k`` is that kernel's output ``k``."""
    out = calls.produced.get(var)
    for key in (k for k in keys if k in sequences and out is not None):
        if calls.sites[out.site].num_outputs == len(sequences[key]):
            for k, element in enumerate(sequences[key]):
                values.setdefault(element, capture.outputs[out.site][k])
