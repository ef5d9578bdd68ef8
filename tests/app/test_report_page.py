"""The HTML report as a reader's browser draws it: Debian's headless chromium (``support.browser``),
offline, one screenshot per state under ``$TVM_PROBE_ARTIFACTS``.

The states are made as a user makes them: ``tvm-probe run configs/demo.yaml`` (a passing report)
and ``tvm-probe compare`` on its dump with tolerance 0 (every float value then fails on rounding
noise: a failing one).  What is asserted is measured in the page:
its height, where the verdict and TVM's warnings sit, that no word of a table is broken across
lines, that the tolerance line lies inside the error plot's axes with the failed values above
it and the passed ones not, that every plot labels its axes, that the graph has its legend and
fits the page's width.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from support import SUPPORT
from support.browser import Chromium, needs_chromium, png_size
from support.processes import run_cli

from tvm_probe.show.graph import FILL

DEMO = SUPPORT.parents[1] / "configs" / "demo.yaml"
WIDTH = 1280  # a laptop's browser window


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """{state: report folder}: the demo run (passing) and its dump compared again at tolerance 0 (failing)."""
    folder = tmp_path_factory.mktemp("report_page")
    run = run_cli("run", DEMO, "--set", f"output.dump={folder / 'dump'}", "--set", f"output.report={folder / 'passing'}")
    assert run.returncode == 0, run.stderr
    again = run_cli("compare", folder / "dump", "--atol", "0", "--rtol", "0", "-o", folder / "failing")
    assert again.returncode == 1 and "FAIL: " in again.stdout, again.stderr
    return {"failing": folder / "failing", "passing": folder / "passing"}


# Every word of every table cell on one line: a Range over each run of non-blank characters
# (between the <wbr> where a name may wrap) must have its boxes on a single line.
BROKEN_WORDS = """(() => {
  const broken = [], styles = new Set();
  for (const cell of document.querySelectorAll('table.data td, table.data th')) {
    const st = getComputedStyle(cell);
    styles.add(st.overflowWrap + '/' + st.wordBreak);
    const walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walk.nextNode(); node; node = walk.nextNode()) {
      for (const m of node.data.matchAll(/\\S+/g)) {
        const r = document.createRange();
        r.setStart(node, m.index); r.setEnd(node, m.index + m[0].length);
        const tops = new Set([...r.getClientRects()].filter(b => b.width > 0).map(b => Math.round(b.top)));
        if (tops.size > 1) broken.push(m[0]);
      }
    }
  }
  return {broken: broken.slice(0, 10), styles: [...styles]};
})()"""

MEASURE = """(() => {
  const rect = el => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const plots = [...document.querySelectorAll('svg.plot')].map(svg => ({
    cls: svg.getAttribute('class'), box: rect(svg), axes: rect(svg.querySelector('rect.axes')),
    labels: [...svg.querySelectorAll('text.axis-label')].map(t => [t.textContent, ...rect(t)]),
    tolerance: [...svg.querySelectorAll('g.tolerance line')].map(rect),
    points: [...svg.querySelectorAll('circle.value')].map(c => [c.classList.contains('failed'), ...rect(c)])}));
  const graph = document.getElementById('kernel-graph');
  return {
    height: document.documentElement.scrollHeight,
    verdict: rect(document.getElementById('verdict')), warnings: rect(document.getElementById('warnings')),
    failed: document.getElementById('failed') ? rect(document.getElementById('failed')) : null,
    plots, legend: [...document.querySelectorAll('#graph-legend .swatch')].map(s =>
      [getComputedStyle(s).backgroundColor, s.parentElement.textContent.trim(), ...rect(s)]),
    graph: {scrollWidth: graph.scrollWidth, clientWidth: graph.clientWidth,
            columns: [...graph.querySelectorAll('svg.graph-column')].map(rect),
            nodes: graph.querySelectorAll('#kernel-graph-body g.node').length},
    warnings_text: document.getElementById('warnings').innerText,
  };
})()"""


def _rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def _open(folder: Path, shot: str) -> dict:
    """Load ``folder/report.html``; screenshots of the first screen and the whole page; the
    measurements (with every <details> opened for the word check)."""
    with Chromium((folder / "report.html").as_uri(), size=(WIDTH, 900)) as browser:
        browser.wait_for(r"Kernel graph", r"Build notes")
        measured = browser.evaluate(MEASURE)
        browser.screenshot(f"{shot}.png")
        full = browser.screenshot(f"{shot}-full.png", full_page=True)
        browser.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
        measured["words"] = browser.evaluate(BROKEN_WORDS)
    assert png_size(full)[0] == WIDTH
    return measured


def _check_common(m: dict, folder: Path) -> None:
    assert m["words"]["broken"] == [], m["words"]
    assert m["words"]["styles"] == ["normal/normal"]  # no overflow-wrap:anywhere, no break-all
    assert m["verdict"][3] < m["warnings"][1]  # the verdict comes before TVM's warnings
    assert m["verdict"][1] < 160  # right under the title
    assert "Fast mode segfaults" in m["warnings_text"] and "(Gather)" in m["warnings_text"]
    assert "1 message, 1 time" in m["warnings_text"]  # grouped, with the ops it concerns
    for plot in m["plots"]:  # both axes labelled, inside the plot
        names = {label[0] for label in plot["labels"]}
        assert len(names) == 2 and all(n.strip() for n in names), plot
        for _, left, top, right, bottom in plot["labels"]:
            assert left >= plot["box"][0] - 1 and right <= plot["box"][2] + 1
            assert top >= plot["box"][1] - 1 and bottom <= plot["box"][3] + 1
    (error,) = [p for p in m["plots"] if "error-plot" in p["cls"]]
    assert error["tolerance"], "the error plot draws no tolerance line"
    for _, top, _, bottom in error["tolerance"]:  # inside the axes, not cut off at their edge
        assert error["axes"][1] - 0.5 <= top and bottom <= error["axes"][3] + 0.5
    # one line (at 1: the error over its allowance); failed values above it, passed ones on or below it
    (line,) = error["tolerance"]
    middle = (line[1] + line[3]) / 2
    assert error["points"] and all((top + bottom) / 2 <= middle - 2 if failed else (top + bottom) / 2 >= middle - 0.5
                                   for failed, _, top, _, bottom in error["points"])
    legend = {text: colour for colour, text, *_ in m["legend"]}
    assert {status: legend.get(status) for status in FILL} == {s: _rgb(c) for s, c in FILL.items()}
    assert all(right - left > 5 and bottom - top > 5 for *_, left, top, right, bottom in m["legend"])
    graph = m["graph"]
    nodes = len(pd.read_csv(folder / "nodes.csv"))  # one row per graph node
    assert graph["scrollWidth"] <= graph["clientWidth"] and graph["nodes"] == nodes
    assert len(graph["columns"]) >= 2  # both layers side by side, not layer 0 alone
    assert max(bottom - top for _, top, _, bottom in graph["columns"]) < 1000


@pytest.mark.slow
@needs_chromium
def test_a_failing_report_says_what_failed_first(reports):
    m = _open(reports["failing"], "report-failing")
    _check_common(m, reports["failing"])
    assert m["failed"] is not None and m["verdict"][3] <= m["failed"][1]  # what failed, right after the verdict
    assert m["height"] < 3200, m["height"]  # was 18,675 px
    (error,) = [p for p in m["plots"] if "error-plot" in p["cls"]]
    assert any(failed for failed, *_ in error["points"])  # tolerance 0: the values that differ, above the line


@pytest.mark.slow
@needs_chromium
def test_a_passing_report_is_one_short_page(reports):
    m = _open(reports["passing"], "report-passing")
    _check_common(m, reports["passing"])
    assert m["failed"] is None
    (error,) = [p for p in m["plots"] if "error-plot" in p["cls"]]
    assert not any(failed for failed, *_ in error["points"])
    assert m["height"] < 2600, m["height"]


@pytest.mark.slow
@needs_chromium
def test_the_tables_list_failures_first_and_name_each_value_once(reports):
    with Chromium((reports["failing"] / "report.html").as_uri(), size=(WIDTH, 900)) as browser:
        browser.wait_for(r"What failed")
        rows = browser.evaluate("""[...document.querySelectorAll('#compared tbody tr')].map(tr =>
            [tr.className, tr.cells[1].textContent, tr.cells[2].textContent])""")
        headers = browser.evaluate("[...document.querySelectorAll('#compared thead th')].map(th => th.textContent)")
        first = browser.evaluate("document.getElementById('first-divergent').textContent")
        top = browser.evaluate("document.querySelector('#failures tbody tr').cells[2].textContent")
    statuses = [s for _, s, _ in rows]
    order = ["first divergent", "diverged", "unchecked", "dead code", "passed"]
    assert statuses == sorted(statuses, key=order.index) and statuses[0] == "first divergent"
    assert rows[0][2] == first == top
    assert "key" not in headers and headers.count("name") == 1 and len(headers) <= 10


# ------------------------------------------------------------------------------ an LLM generation
@pytest.fixture(scope="module")
def generation_report(tmp_path_factory):
    """``tvm-probe run`` of a generate config (a tiny Llama, 4 steps) at tolerance 0: its report
    folder and what it printed."""
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("generation")
    config = folder / "llm.yaml"
    config.write_text(f"model: {{hf: '{SUPPORT / 'hf_models.py'}:tiny_llama'}}\n"
                      "generate: {prompt: random, steps: 4, length: 5}\n"
                      "reference: {runtime: torch, atol: 0, rtol: 0}\n"
                      f"output: {{report: {folder / 'report'}}}\n")
    run = run_cli("run", config)
    assert run.returncode in (0, 1), run.stderr
    return folder / "report", run.stdout


@pytest.mark.slow
@needs_chromium
def test_an_llm_generation_report_marks_the_layers_out_of_tolerance(generation_report):
    folder, printed = generation_report
    with Chromium((folder / "report.html").as_uri(), size=(WIDTH, 900)) as browser:
        browser.wait_for(r"Max abs error per step and decoder layer")
        m = browser.evaluate("""(() => {
          const rect = el => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
          const map = document.querySelector('svg.layer-map');
          return {height: document.documentElement.scrollHeight, verdict: rect(document.getElementById('verdict')),
            layers: rect(document.getElementById('layer-errors')), map: rect(map),
            labels: [...map.querySelectorAll('text.axis-label')].map(t => t.textContent),
            legend: [...map.querySelectorAll('g.legend text')].map(t => [t.textContent, ...rect(t)]),
            cells: [...document.querySelectorAll('#layer-errors tbody td:not(:first-child)')].map(td =>
              [td.textContent, td.classList.contains('failed')]),
            mapFailed: map.querySelectorAll('rect.cell.failed').length,
            tokens: [...document.querySelectorAll('#tokens tbody tr')].map(tr => tr.cells[1].textContent)};
        })()""")
        browser.screenshot("report-llm.png", full_page=True)
        words = browser.evaluate(BROKEN_WORDS)
    assert words["broken"] == [] and words["styles"] == ["normal/normal"]
    assert m["height"] < 1400 and m["verdict"][3] < m["layers"][1]
    assert sorted(m["labels"]) == ["decoder layer", "generation step"]
    assert len(m["legend"]) >= 5 and all(right <= m["map"][2] + 1 for _, _, _, right, _ in m["legend"])
    # tolerance 0: a layer's cell is out of tolerance exactly when its error is not 0
    assert len(m["cells"]) == 8 and all(failed == (text != "0") for text, failed in m["cells"])
    assert m["mapFailed"] == sum(failed for _, failed in m["cells"])
    tokens = printed.splitlines()[0].removeprefix("tokens: ")
    assert f"[{', '.join(m['tokens'])}]" == tokens
