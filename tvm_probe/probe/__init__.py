"""The probe stage (see docs/architecture.md)."""
from .probe import (  # noqa: F401
    log, CaptureSpec, Probe,
)
