"""Multi-function executables (issue 25): a function's view of the one build, and the paged KV
caches a function attends with (read after each call that asks for their K/V)."""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from ..build.compile import Snapshots
from ..importer.kv_cache import cache_layouts, read_kv
from ..importer.relax import final_view, function_view


def function_built(built, function: str):
    """``built`` (the whole executable) as the map stage sees ``function``: view snapshots."""
    s = built.snapshots
    views = Snapshots(pre_fold=function_view(s.pre_fold, function), pre_fusion=function_view(s.pre_fusion, function),
                      post_fusion=function_view(s.post_fusion, function),
                      call_graph=function_view(s.call_graph, function), final=final_view(s.final, function),
                      passes=s.passes)
    views.whole_final = s.final  # every function's kernels (a VM made by hand must resolve them all)
    return replace(built, snapshots=views)


class KVCaches:
    """The paged KV caches of one function (:class:`tvm_probe.importer.kv_cache.CacheLayout`s) and the
    names of their keys and values (``paged_kv_cache.layers.0.k``...)."""

    def __init__(self, func):
        self.layouts = cache_layouts(func)
        self.names = frozenset(n for layout in self.layouts for n in layout.names())

    def split(self, capture):
        """The caches whose K/V a call with ``capture`` reads afterwards, and ``capture`` less
        the K/V names (which are no kernel outputs)."""
        if not self.layouts or capture is None:
            return [], capture
        if capture == "all":
            return self.layouts, capture
        names = [capture] if isinstance(capture, str) else list(capture)
        if not self.names.intersection(names):
            return [], capture
        chosen = [l for l in self.layouts if any(n in self.names and n.startswith(l.name + ".") for n in names)]
        return chosen, [n for n in names if n not in self.names]

    @staticmethod
    def read(arguments, layouts) -> Mapping:
        """What the caches ``layouts`` hold now, by name (``arguments``: the call's, by parameter)."""
        if len(layouts) == 1:  # (the usual case: one cache, read as it is)
            return read_kv(arguments[layouts[0].param], layouts[0])
        found = {}
        for layout in layouts:
            found.update(read_kv(arguments[layout.param], layout))
        return found
