"""Whether this machine can build tvm_probe's native library (a C++ compiler and ninja)."""
from __future__ import annotations

import os
import shutil

HAS_TOOLS = shutil.which(os.environ.get("CXX", "c++")) is not None and shutil.which("ninja") is not None
