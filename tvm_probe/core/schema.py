"""Facts the library, the config and the CLI share, each stated once.

Tolerances have their own home (:mod:`tvm_probe.core.tolerance`), demo sizes theirs
(:data:`tvm_probe.importer.demo.PRESETS`).
"""
from __future__ import annotations

import fnmatch
from enum import Enum, IntEnum

#: The two pipelines a model is built under as users deploy it: "default", what ``tvm.compile``
#: uses (unfused on CPU), and "fused", ``relax.get_default_pipeline(target)``.
PIPELINES = ("default", "fused")
#: Every pipeline ``pipeline=`` takes by name: TVM's own (``relax.pipeline.PIPELINE_MAP`` of TVM
#: 0.27, what ``tvm.compile(relax_pipeline=NAME)`` takes) and "fused"
#: (see :func:`tvm_probe.build.resolve_pipeline`).
PIPELINE_NAMES = PIPELINES + ("default_build", "zero", "static_shape_tuning")
DEFAULT_PIPELINE = "default"
DEFAULT_TARGET = "llvm"


class ModelKind(str, Enum):
    """The kinds of source model a file or a factory gives (compares equal to its value:
    ``ModelKind.ONNX == "onnx"``).  What each kind means — importer, reference, description — is
    its adapter's (:mod:`tvm_probe.importer.kinds`, which also has the kinds given in Python)."""

    ONNX = "onnx"
    TFLITE = "tflite"
    TORCH = "torch"
    DEMO = "demo"  # the built-in ONNX BERT, built in code

    def __str__(self) -> str:
        return self.value


REPORT_FORMATS = ("csv", "html", "graph")


class Exit(IntEnum):
    """Exit statuses of ``tvm-probe``; :attr:`meaning` is what ``--help`` and the README say."""

    OK = 0, "all values checked and within tolerance"
    DIVERGED = 1, "some value diverges or was left unchecked"
    BAD_INPUT = 2, "bad input (a bad model, config, input or dump: a one-line error says which)"
    INTERNAL = 3, "internal error (a tvm_probe bug, or a TVM behaviour it does not know)"
    TVM_FAILED = 4, "TVM cannot import, compile or run the model (the error names where)"

    def __new__(cls, value: int, meaning: str):
        member = int.__new__(cls, value)
        member._value_ = value
        member.meaning = meaning
        return member


EXIT_HELP = "Exit status: " + ", ".join(f"{int(e)} {e.meaning}" for e in Exit) + "."


def name_matches(name: str, pattern: str) -> bool:
    """The glob rule everywhere a pattern selects names: the whole name, or a '/'-suffix of it.

    ``*/self/Softmax`` and ``self/Softmax`` both match ``bert/layer_._0/attention/self/Softmax``.
    """
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, "*/" + pattern.lstrip("/"))
