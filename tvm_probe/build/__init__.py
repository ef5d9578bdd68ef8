"""The build stage (see docs/architecture.md)."""
from .compile import (  # noqa: F401
    log, PipelineLike, Snapshots, BuiltModel, parse_target, resolve_pipeline, compile_with_snapshots, compile_plain,
)
