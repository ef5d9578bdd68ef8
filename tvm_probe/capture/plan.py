"""Capture planning: what one run must copy to serve the values it is asked for.

A :class:`CapturePlan` is fixed per selection and hashable: executors, the native driver and the
hooked VMs key everything they prepare by it, so a selection is planned once and prepared once.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..kernel_map import ArgKind, KernelMap, PlaceKind

#: Plans prepared per executor (native sessions, hooked VMs), one per distinct CapturePlan: a
#: probe asks for a handful of selections, and each prepared plan holds a session and arenas.
MAX_PLANS = 16


@dataclass(frozen=True)
class CapturePlan:
    """What one run copies.  ``outputs=None`` means every node's outputs.

    Attributes:
        outputs: the call sites whose outputs are copied (None: all of them).
        untracked_inputs: the fused call sites whose untracked inputs are copied too (values
            kept inside those kernels are recomputed from them).
    """

    outputs: frozenset[int] | None = None
    untracked_inputs: frozenset[int] = frozenset()

    def wants_output(self, node: int) -> bool:
        return self.outputs is None or node in self.outputs


class CapturePlanner:
    """What a run must copy to serve the values it is asked for (``run(capture=...)``).

    ``"all"``: every node output (and the untracked inputs of every fused site that keeps a
    source value inside); ``None``: nothing; names or patterns: the outputs of the nodes holding
    those values, or the inputs of the fused kernels that keep them inside.  Fixed per probe, so
    each selection is planned once (on a 300-kernel model planning took longer than the run).
    """

    def __init__(self, kernel_map: KernelMap, names):
        self._km, self._names = kernel_map, names
        passed = {p.site for p in kernel_map.places.values() if p.kind is PlaceKind.ARGUMENT}
        # (an element of a tuple parameter — a packed weight — is read from the call's arguments)
        self._untracked_all = frozenset(s.index for s in kernel_map.sites
                                        if (s.group or s.index in passed)
                                        and any(a.kind is ArgKind.UNTRACKED and a.param_item is None for a in s.args))
        self._selections: dict[tuple[str, ...], tuple[CapturePlan, set[str]]] = {}
        self._any_interior = any(p.kind is PlaceKind.INTERIOR for p in kernel_map.places.values())
        self._everything = CapturePlan(outputs=None, untracked_inputs=self._untracked_all), None
        self._nothing = CapturePlan(outputs=frozenset()), frozenset()

    def plan(self, capture) -> tuple[CapturePlan, set[str] | None]:
        """The plan, and the keys asked for (None: everything).  The same plan object for the
        same selection (executors key what they prepare by it)."""
        if capture is None:
            return self._nothing
        if capture == "all":
            return self._everything
        patterns = (capture,) if isinstance(capture, str) else tuple(capture)
        if patterns not in self._selections:
            self._selections[patterns] = self._select(patterns)
        return self._selections[patterns]

    def recomputes(self, wanted: set[str] | None) -> bool:
        """Whether serving ``wanted`` (None: every value) recomputes values kept inside kernels."""
        if wanted is None:
            return self._any_interior
        places = self._km.places
        return any(k in places and places[k].kind is PlaceKind.INTERIOR for k in wanted)

    def _select(self, patterns: tuple[str, ...]) -> tuple[CapturePlan, set[str]]:
        km = self._km
        wanted = {k for p in patterns for k in self._names.match(p)}
        outputs, untracked = set(), set()
        for key in wanted:
            place = km.places.get(key)
            if place is None:
                continue
            if place.kind is PlaceKind.OUTPUT:
                outputs.add(place.site)
            elif place.kind is PlaceKind.ARGUMENT:  # (an If's result: the input of the call reading it)
                untracked.add(place.site)
            elif place.kind is PlaceKind.INTERIOR:
                site = km.sites[place.site]
                outputs |= {a.node for a in site.args if a.kind is ArgKind.NODE}
                if site.index in self._untracked_all:
                    untracked.add(site.index)
        return CapturePlan(outputs=frozenset(outputs), untracked_inputs=frozenset(untracked)), wanted
