"""The capture stage (see docs/architecture.md and :mod:`tvm_probe.capture.executor`)."""
from .executor import INSTRUMENT_ENV, DebugExecutor, log  # noqa: F401
from .fast_call import FastCall  # noqa: F401
from .observer import ExecutorHandle, Observer  # noqa: F401
from .plan import CapturePlan, CapturePlanner  # noqa: F401
from .result import ArenaOutputs, Capture  # noqa: F401
from .transfer import tvm_tensor  # noqa: F401
