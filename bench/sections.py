"""bench/results.md, one section per benchmark: a script replaces its own section (by title)
and leaves the others as they are."""
from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results.md"


def write_section(title: str, lines: list[str], results: Path = RESULTS) -> str:
    """Put ``## title`` followed by ``lines`` in ``results`` (in place of a section of that
    title, else at the end); returns the section's text."""
    section = "\n".join([f"## {title}", "", *lines]).rstrip("\n") + "\n"
    text = results.read_text(encoding="utf-8") if results.exists() else "# tvm_probe benchmark results\n"
    start = text.find(f"## {title}\n")
    if start < 0:
        results.write_text(text.rstrip("\n") + "\n\n" + section, encoding="utf-8")
        return section
    nxt = text.find("\n## ", start + 1)
    rest = text[nxt + 1:] if nxt >= 0 else ""
    results.write_text(text[:start] + section + ("\n" + rest if rest else ""), encoding="utf-8")
    return section
