"""TVM's failures and warnings in source terms (:mod:`.failures`), above build and the kernel map."""
from __future__ import annotations

from ..build.compile import BuiltModel, PipelineLike
from ..build.compile import compile_with_snapshots as _compile
from ..core.schema import DEFAULT_PIPELINE
from . import failures


def compile_with_snapshots(mod, target, pipeline: PipelineLike = DEFAULT_PIPELINE, imported=None) -> BuiltModel:
    """:func:`tvm_probe.build.compile.compile_with_snapshots`, its failures and warnings named in
    source terms (the pass or kernel, the source ops) by :mod:`.failures`."""
    return _compile(mod, target, pipeline, imported, diagnosis=failures)
