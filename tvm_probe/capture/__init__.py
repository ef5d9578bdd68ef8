"""The capture stage (see docs/architecture.md)."""
from .executor import (  # noqa: F401
    log, INSTRUMENT_ENV, CapturePlan, CapturePlanner, Capture, tvm_tensor, DebugExecutor, FastCall, ArenaOutputs,
)
