"""The CLI and Python in a fresh process, as a user's shell runs them.

Here rather than in ``conftest.py``: a test module cannot import a conftest by name once a
subfolder has a ``conftest.py`` of its own (both are the module ``conftest``).
"""
from __future__ import annotations

import subprocess
import sys


def run_cli(*args, quiet: bool = True) -> subprocess.CompletedProcess:
    """``tvm-probe ARGS`` in a fresh process, as a user's shell runs it (exit status, stdout, stderr)."""
    return subprocess.run([sys.executable, "-m", "tvm_probe.app.cli", *(["--quiet"] if quiet else []), *map(str, args)],
                          capture_output=True, text=True)


def run_python(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh Python process (to test imports and missing packages)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
