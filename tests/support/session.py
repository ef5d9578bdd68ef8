"""State one test session shares between tests and ``conftest.py``'s terminal summary."""
from __future__ import annotations

SERVED_COUNTS: dict[str, dict[str, int]] = {}  # filled by models/test_bert.py, printed at the end
