"""Facts the library, the config and the CLI share, each stated once.

Tolerances have their own home (:mod:`tvm_probe.tolerance`), demo sizes theirs
(:data:`tvm_probe.demo.PRESETS`).
"""
from __future__ import annotations

import fnmatch
from enum import IntEnum

PIPELINES = ("default", "fused")
REFERENCES = ("none", "onnxruntime", "torch", "tflite", "tvm")  # tvm: another TVM build of the model
REPORT_FORMATS = ("csv", "html", "graph")


class Exit(IntEnum):
    """Exit statuses of ``tvm-probe``."""

    OK = 0          # every value asked about was compared and is within tolerance
    DIVERGED = 1    # some value diverges, or was asked about and could not be checked
    BAD_INPUT = 2   # a bad model, config, input or dump: a one-line error says which
    INTERNAL = 3    # a bug in tvm_probe (or a TVM behaviour it does not know)
    TVM_FAILED = 4  # TVM cannot import, compile or run the model: the error names where


EXIT_HELP = ("Exit status: 0 all values checked and within tolerance, 1 some value diverges or was left "
             "unchecked, 2 bad input, 3 internal error (a tvm_probe bug), 4 TVM cannot import, compile "
             "or run the model.")


def name_matches(name: str, pattern: str) -> bool:
    """The glob rule everywhere a pattern selects names: the whole name, or a '/'-suffix of it.

    ``*/self/Softmax`` and ``self/Softmax`` both match ``bert/layer_._0/attention/self/Softmax``.
    """
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, "*/" + pattern.lstrip("/"))
