"""The docs run as written: every ``python`` block of README.md and docs/*.md.

A reader copies a file's blocks in order into one Python session, in an empty folder, and may do
it again in the same folder the next day; so each file's blocks run here in order, in one
namespace, in a fresh temporary folder, and then a second time in that folder (an example that
writes a dump must not trip on the one its first run left).  Sybil finds the blocks and runs
them (its Markdown parser and Python evaluator, which reports the failing line of the ``.md``
file); other fences (```bash, ```text, ```yaml) are not run.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser

ROOT = Path(__file__).parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Files whose two runs take longer than 30 s on 2 CPU cores (still run in CI).
SLOW = {"README.md", "llm.md"}

SYBIL = Sybil(parsers=[PythonCodeBlockParser()])


def run_blocks(path: Path) -> list[dict]:
    """Run ``path``'s python blocks in order in one namespace; return the namespace as it was
    after each block (shallow copies: a later block may rebind a name an earlier one set)."""
    document = SYBIL.parse(path)
    after = []
    for example in document:
        example.evaluate()
        after.append(dict(document.namespace))
    return after


def doc_params():
    for path in DOCS:
        marks = [pytest.mark.slow] if path.name in SLOW else []
        yield pytest.param(path, id=str(path.relative_to(ROOT)), marks=marks)


@pytest.fixture
def empty_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("path", doc_params())
def test_a_docs_file_runs_as_written_twice(path, empty_folder):
    for _ in range(2):
        after = run_blocks(path)
    check_values(path.name, after)


def check_values(name: str, after: list[dict]) -> None:
    """What some blocks say in comments, checked on the values they computed."""
    import numpy as np

    if name == "README.md":  # "Use it from Python": the dump, read with numpy alone, holds what get served
        scope = next(s for s in after if "r" in s)
        np.testing.assert_array_equal(scope["r"].get("layer_._0/attention/self/MatMul"), scope["x"])


def test_every_docs_file_with_python_blocks_is_found():
    """A docs file the glob misses would never be run: the list covers README.md and docs/."""
    with_blocks = [p.name for p in DOCS if list(SYBIL.parse(p))]
    assert {"README.md", "api.md", "llm.md", "precision.md"} <= set(with_blocks)
