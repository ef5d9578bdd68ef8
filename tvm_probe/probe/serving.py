"""How one build serves a source value from a run's capture (the probe's read path).

A :class:`ValueServer` is made once per probe from its import, build and kernel map; every
method takes the capture to serve from, so the probe decides which run (or call) that is and
keeps what was computed from it.
"""
from __future__ import annotations

import numpy as np

from ..build.compile import parse_target
from ..capture.executor import Capture
from ..capture.recompute import evaluate_folded
from ..core.errors import NotCapturedError, ProbeError
from ..core.results import not_computed
from ..core.schema import DEFAULT_TARGET
from ..core.sources import Served
from ..kernel_map import ArgKind, PlaceKind
from ..kernel_map.shape_values import evaluate
from .calls import as_numpy


#: how a value served from a kernel's output is served (captured, or a view of one)
_KERNEL_OUTPUTS = frozenset((Served.CAPTURED, Served.VIEW))


class ValueServer:
    """Source values of one build, served from captures of its runs."""

    def __init__(self, imported, built, kernel_map, servings, recomputer):
        self.imported, self.built, self.kernel_map = imported, built, kernel_map
        self.servings, self.recomputer = servings, recomputer

    def value(self, key: str, capture: Capture, computed: dict, folded: dict) -> np.ndarray:
        """The value of ``key`` in the run ``capture`` holds; values recomputed from that run are
        kept in ``computed``, those the pipeline folded in ``folded`` (the same for every run)."""
        serving, place = self.servings[key], self.kernel_map.places.get(key)
        served = serving.served
        value = self.imported.sources[key]
        if served in _KERNEL_OUTPUTS:  # (most values: first)
            return self.site_output(capture, place.site, place.output, value.display_name)
        if served is Served.INPUT:
            item = getattr(self.imported, "param_items", {}).get(key)
            if item is not None:  # an element of a tuple argument (packed weights)
                return as_numpy(capture.inputs[item.param][item.element])
            return as_numpy(capture.inputs[serving.node_index])
        if served is Served.SHAPE and place.kind is PlaceKind.DIMS:  # a shape built from input sizes
            shapes = [getattr(a, "shape", ()) for a in capture.inputs]
            dims = np.array([evaluate(d, shapes) for d in place.inner], dtype=value.dtype or "int64")
            return dims.reshape(value.shape if value.shape is not None and int(np.prod(value.shape)) == dims.size
                                else () if place.output else dims.shape)
        if served is Served.SHAPE:  # the ONNX value is an int64 scalar or [1] tensor of that size
            size = capture.inputs[place.input_index].shape[place.output]
            return np.asarray(size, dtype=value.dtype or "int64").reshape(value.shape or ())
        if served is Served.CONSTANT:
            return self.imported.constants[key]
        if served is Served.FOLDED:
            if key not in folded:
                folded.update(self.folded_values())
            return folded[key]
        if served is Served.PASSED:  # an If's result: where the VM passed it on
            if place.kind is PlaceKind.RETURNED:
                return as_numpy(capture.result[place.output])
            held = capture.untracked_inputs.get(place.site, {})
            if place.output not in held:
                raise NotCapturedError(f"{value.display_name!r} was not captured by the last run: add it to "
                                       "run(..., capture=[...]) or use capture='all'")
            return held[place.output]
        if served is Served.RECOMPUTED:
            if key not in computed:
                computed.update(self.kept_inside(capture, self.kernel_map.sites[place.site], key))
            return computed[key]
        raise not_computed(value, served, self.kernel_map.lost.get(key, ""), key in self.kernel_map.known_limits)

    def values(self, keys: list[str], capture: Capture, computed: dict, folded: dict) -> list:
        """:meth:`value` of each of ``keys``, each the array or the :class:`ProbeError` that says
        why not.  A kernel output the capture holds is taken straight from it (a generation
        compare serves hundreds a step); every other value goes through :meth:`value`."""
        out, servings, places, outputs = [], self.servings, self.kernel_map.places, capture.outputs
        for key in keys:
            if servings[key].served in _KERNEL_OUTPUTS:
                place = places[key]
                site_outputs = outputs.get(place.site)
                if site_outputs is not None:
                    out.append(site_outputs[place.output])
                    continue
            try:
                out.append(self.value(key, capture, computed, folded))
            except ProbeError as err:
                out.append(err)
        return out

    def folded_values(self) -> dict[str, np.ndarray]:
        """Every value the pipeline folded: constants as they are, the rest in one build."""
        places = {k: p for k, p in self.kernel_map.places.items() if self.servings[k].served is Served.FOLDED}
        values = {k: p.const.value.numpy() for k, p in places.items() if p.kind is PlaceKind.CONSTANT}
        folded = {k: p.var for k, p in places.items() if p.kind is PlaceKind.FOLDED}
        unique = list(dict.fromkeys(folded.values()))
        if unique:
            # on this machine's CPU, as FoldConstant itself evaluates them (TVM builds them for "llvm")
            arrays = dict(zip(unique, evaluate_folded(self.built.snapshots.pre_fold, unique, parse_target(DEFAULT_TARGET))))
            values.update({k: arrays[v] for k, v in folded.items()})
        return values

    def kept_inside(self, capture: Capture, site, key: str) -> dict[str, np.ndarray]:
        """Every source value the fused call site ``site`` keeps inside, recomputed from the inputs
        it received in ``capture`` (``key`` names the value asked for in errors)."""
        inputs = self.site_inputs(capture, site, self.imported.sources[key].display_name)
        places = self.kernel_map.places
        keys = [k for k in site.interior_keys if places[k].kind is PlaceKind.INTERIOR]
        shapes = [getattr(a, "shape", None) for a in capture.inputs]
        tensors = self.recomputer.interior_values(site, inputs, {places[k].inner for k in keys}, shapes)
        return {k: tensors[places[k].inner] for k in keys}

    @staticmethod
    def site_output(capture: Capture, site: int, k: int, why: str) -> np.ndarray:
        outs = capture.outputs.get(site)
        if outs is None:
            raise NotCapturedError(
                f"{why!r} was not captured by the last run: add it to run(..., capture=[...]) "
                "or use capture='all'")
        return outs[k]

    def site_inputs(self, capture: Capture, site, why: str) -> list[np.ndarray]:
        values = []
        for j, arg in enumerate(site.args):
            if arg.kind is ArgKind.NODE:
                values.append(self.site_output(capture, arg.node, arg.output, why))
            elif arg.kind is ArgKind.INPUT:
                values.append(capture.inputs[arg.input_index])
            elif arg.kind is ArgKind.CONST:
                values.append(arg.const.value.numpy())
            elif arg.param_item is not None:  # an element of a tuple argument (packed weights)
                values.append(as_numpy(capture.inputs[arg.param_item[0]][arg.param_item[1]]))
            else:
                held = capture.untracked_inputs.get(site.index, {})
                if j not in held:
                    raise NotCapturedError(f"the inputs of the kernel computing {why!r} were not captured: "
                                           "add it to run(..., capture=[...]) or use capture='all'")
                values.append(held[j])
        return values

    @staticmethod
    def can_recompute(capture: Capture, site) -> bool:
        """Whether ``capture`` kept every input of the call site ``site``."""
        held = capture.untracked_inputs.get(site.index, {})
        return all(a.node in capture.outputs if a.kind is ArgKind.NODE else (a.kind is not ArgKind.UNTRACKED or a.param_item is not None or j in held)
                   for j, a in enumerate(site.args))


def join_build(thread) -> None:
    """Wait for a build started alongside a run.  A Ctrl-C meanwhile is raised once it is over:
    while it lasts, file descriptor 2 goes to the log, and so would the interruption's message."""
    interrupted = False
    while thread.is_alive():
        try:
            thread.join()
        except KeyboardInterrupt:
            interrupted = True
    if interrupted:
        raise KeyboardInterrupt
