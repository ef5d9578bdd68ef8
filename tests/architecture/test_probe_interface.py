"""Modules other than probe.py use the Probe only through its public interface.

A collaborator that reaches into ``probe._capture`` ties itself to how the probe keeps its state
today; the store, the calls and the LLM driver ask the probe by public, documented names
(``last_capture``, ``serving_call``, ``call_records``, ``values_kept_inside``...) instead.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tvm_probe"
OWNER = PACKAGE / "probe" / "probe.py"  # the one module that may use the Probe's private members


def _is_probe(node: ast.expr) -> bool:
    """``probe`` (a variable or parameter) or ``self.probe``."""
    if isinstance(node, ast.Name):
        return node.id == "probe"
    return isinstance(node, ast.Attribute) and node.attr == "probe" and isinstance(node.value, ast.Name) \
        and node.value.id == "self"


def private_probe_reads(source: str) -> list[tuple[int, str]]:
    """``(line, attribute)`` of every private attribute (``_x``, not a dunder) read on a probe."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _is_probe(node.value) and node.attr.startswith("_") \
                and not (node.attr.startswith("__") and node.attr.endswith("__")):
            found.append((node.lineno, node.attr))
    return sorted(found)


def test_no_module_but_probe_py_touches_private_probe_members():
    offenders = [f"{path.relative_to(ROOT)}:{line}: probe.{attr}"
                 for path in sorted(PACKAGE.rglob("*.py")) if path != OWNER
                 for line, attr in private_probe_reads(path.read_text())]
    assert not offenders, "use the Probe's public interface (or add one to probe.py):\n" + "\n".join(offenders)


def test_the_checker_catches_private_reads_and_lets_public_ones_pass():
    snippet = (
        "def dump(probe, records):\n"
        "    capture = probe._require_run()\n"          # a private method
        "    n = len(probe._calls)\n"                   # a private attribute
        "    probe._values = {}\n"                      # written, not only read
        "    probe.__class__, probe.nodes\n"            # a dunder and a public name: fine
        "class Tool:\n"
        "    def go(self):\n"
        "        return self.probe._executor.run()\n"   # through self.probe
        "    def other(self, prober):\n"
        "        return prober._x, self._y\n"           # other names: not probes
    )
    assert private_probe_reads(snippet) == [(2, "_require_run"), (3, "_calls"), (4, "_values"), (8, "_executor")]
