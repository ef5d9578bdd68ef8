"""Import paths from before the stages became packages keep working (users' scripts do not break).

``import tvm_probe.hf`` gives the module now at ``tvm_probe.llm.hf``: the same module object, not
a copy, so ``monkeypatch`` and ``isinstance`` see one thing.  New code imports the new paths.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

#: old path (below tvm_probe) -> where the module lives now
MOVED = {
    "errors": "core.errors", "schema": "core.schema", "sources": "core.sources", "names": "core.names",
    "results": "core.results", "dtypes": "core.dtypes", "device": "core.device",
    "tolerance": "core.tolerance", "inputs": "core.inputs", "native_log": "core.native_log",
    "viewable": "core.viewable", "describe": "core.describe", "failures": "diagnose.failures",
    "progress": "app.progress", "config": "app.config", "investigate": "app.investigate", "cli": "app.cli",
    "dump_reference": "comparison.dump", "relax_analysis": "kernel_map.relax_analysis",
    "valuenum": "kernel_map.valuenum", "passes": "build.passes",
    "kernel_hook": "capture.kernel_hook", "recompute": "capture.recompute", "instrument": "capture.instrument",
    "native": "capture.native", "remote": "capture.remote", "remote.spec": "capture.remote.spec",
    "remote.client": "capture.remote.client", "remote.server": "capture.remote.server",
    "compare": "comparison", "reference": "comparison.reference", "reference.onnxruntime": "comparison.reference.onnxruntime",
    "reference.torch": "comparison.reference.torch", "reference.tflite": "comparison.reference.tflite",
    "calls": "probe.calls", "verify": "probe.verify", "kv_cache": "importer.kv_cache", "demo": "importer.demo",
    "hf": "llm.hf", "split": "tools.split", "reduce": "tools.reduce", "precision": "tools.precision",
    "precision.analysis": "tools.precision.analysis", "precision.search": "tools.precision.search",
    "precision.spec": "core.precision", "precision.lower": "build.precision",
    "quantization": "tools.quantization",
    "report": "show.report", "view": "show.view",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``tvm_probe.<old>`` and answers with the module at its new path."""

    def find_spec(self, fullname, path=None, target=None):
        old = fullname[len(__package__) + 1:] if fullname.startswith(__package__ + ".") else None
        if old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(f"{__package__}.{MOVED[spec.name[len(__package__) + 1:]]}")
        self._real_spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self._real_spec  # the import system wrote the old name's spec over it


def install() -> None:
    """Put the finder first on ``sys.meta_path``, once."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())  # before PathFinder, which would load a second copy
