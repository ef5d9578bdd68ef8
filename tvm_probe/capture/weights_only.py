"""Kernel outputs computed from the weights alone: captured at two calls, compared, then served (issue 35).

Under ``default`` a decode step recomputes every transposed weight at every call (each a kernel
output), ~320 KB of a small step's ~340 KB of captured values; writing them into fresh memory at
every call cost more than the step itself.  Such a value is the same at every call while the
weights are: :class:`WeightsOnly` captures it at a function's first two calls of everything,
compares the two captures byte for byte, and from then on the function's calls copy the other
outputs only and serve these from the first capture, saying so (:meth:`WeightsOnly.provenance`).
If the two captures differ (a nondeterministic kernel), it warns and captures them at every call.
Replacing the weights (``Probe.set_params``) starts it over.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np

from ..kernel_map import ArgKind, KernelMap
from .plan import CapturePlan
from .result import Capture


def weights_only_sites(km: KernelMap, weight_inputs) -> frozenset[int]:
    """The call sites whose outputs depend on constants and the weights alone: every argument a
    constant, a weight (a parameter at ``weight_inputs``, or an element of one: packed weights)
    or an output of such a site, the output
    shapes static (no shape variable of the call), and no VM builtin or packed function (a KV
    cache's attention reads state no argument shows).  Sites are in call order, so one pass sees
    each argument's site first."""
    weights, found = frozenset(weight_inputs), set()
    for site in km.sites:
        if site.packed or (site.symbol.startswith("vm.builtin.") and not site.is_view):
            continue
        if any(not isinstance(d, (int, np.integer)) for shape in site.out_shapes for d in shape):
            continue
        if all(a.kind is ArgKind.CONST or (a.kind is ArgKind.INPUT and a.input_index in weights)
               or (a.param_item is not None and a.param_item[0] in weights)
               or (a.kind is ArgKind.NODE and a.node in found) for a in site.args):
            found.add(site.index)
    return frozenset(found)


class WeightsOnly:
    """One function's weights-only outputs under ``capture="all"``: which plan a call runs, and
    what the call's capture serves (see the module's docstring).

    Args:
        km: the function's kernel map.
        weight_inputs: the positions of the function's parameters that are weights the probe
            holds (``params=``); constants are weights too.
        everything: the plan of ``capture="all"``.
    """

    def __init__(self, km: KernelMap, weight_inputs, everything: CapturePlan):
        self.sites = weights_only_sites(km, weight_inputs)
        self.everything = everything
        others = frozenset(s.index for s in km.sites) - self.sites
        self.reduced = CapturePlan(outputs=others, untracked_inputs=everything.untracked_inputs)
        self.reset()

    def reset(self) -> None:
        """Forget what was captured (the weights changed): the next two calls capture everything."""
        self._first: tuple[int, dict] | None = None
        self.served: tuple[int, dict] | None = None  # (call, site → arrays) once two captures agreed
        self.compared: tuple[int, int] | None = None  # the two calls whose captures agreed
        self.every_call = not self.sites  # nothing to serve, or a nondeterministic kernel among them

    def next_run(self, every: bool) -> tuple[CapturePlan, bool]:
        """The plan of this function's next call of everything, and whether it times every kernel
        (``every``: as asked); once the weights-only outputs are served, the reduced plan, every
        kernel timed as a capture of everything is."""
        return (self.reduced, True) if self.served is not None else (self.everything, every)

    def took(self, call: int, capture: Capture, plan: CapturePlan) -> None:
        """After call ``call`` ran ``plan`` (:meth:`plan`'s): serve, or observe, its capture."""
        if plan is self.reduced:
            self.serve(capture)
        else:
            self.observe(call, capture)

    def observe(self, call: int, capture: Capture) -> None:
        """After call ``call`` of everything: keep its weights-only outputs (the first call), or
        compare them with the first call's (the second): equal, they are served from now on."""
        if self.served is not None or self.every_call:
            return
        outputs = {site: capture.outputs[site] for site in self.sites if site in capture.outputs}
        if self._first is None:  # (copies: the call's capture may be forgotten, its arena reused)
            self._first = call, {site: [np.array(a, copy=True) for a in arrays] for site, arrays in outputs.items()}
            return
        first_call, first = self._first
        differ = sorted(site for site in self.sites if not _same(first.get(site), outputs.get(site)))
        if differ:
            self.every_call = True
            warnings.warn(f"{len(differ)} kernel output(s) computed from the weights alone differ between calls "
                          f"{first_call} and {call} (a nondeterministic kernel, e.g. call site {differ[0]}): "
                          "they are captured at every call from now on", RuntimeWarning, stacklevel=4)
            return
        self.served, self.compared = (first_call, first), (first_call, call)

    def serve(self, capture: Capture) -> None:
        """Make ``capture`` (a call of the reduced plan) serve the weights-only outputs too."""
        call, served = self.served
        capture.outputs = ServedOutputs(capture.outputs, served)
        capture.served_from = call

    def provenance(self, site: int, capture: Capture) -> str | None:
        """Why a weights-only output of ``capture`` is another call's capture, or None when
        ``capture`` copied it itself."""
        call = capture.served_from
        if call is None or site not in self.sites:
            return None
        first, second = self.compared
        return (f"captured at call {call}; computed from the weights alone, so the same in every call while the "
                f"weights are unchanged (calls {first} and {second} captured it byte for byte alike)")


def _same(a, b) -> bool:
    """Byte-equal lists of arrays (NaN equal to itself), None for a site not captured."""
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(x.shape == y.shape and x.dtype == y.dtype and x.tobytes() == y.tobytes()
                                    for x, y in zip(a, b))


class ServedOutputs(Mapping):
    """A call's own outputs (:attr:`own`), and the weights-only ones served from an earlier
    call's capture (:attr:`served`: by site)."""

    def __init__(self, own: Mapping, served: dict):
        self._own, self._served = own, served

    @property
    def own(self) -> Mapping:
        return self._own

    @property
    def served(self) -> dict:
        return self._served

    def __getitem__(self, site: int) -> list[np.ndarray]:
        found = self._served.get(site)
        return found if found is not None else self._own[site]

    def get(self, site: int, default=None):
        found = self._served.get(site)  # (Mapping.get goes through __getitem__ and a KeyError)
        return found if found is not None else self._own.get(site, default)

    def __contains__(self, site) -> bool:
        return site in self._served or site in self._own

    def __iter__(self):
        return iter(sorted({*self._own, *self._served}))

    def __len__(self) -> int:
        return len({*self._own, *self._served})
