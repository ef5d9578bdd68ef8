"""The report on real models: TVM's fused kernel names run past 100 characters of ``op_op_op``,
and the tables that show them must stay readable in a reader's browser (Debian's headless
chromium, ``support.browser``).

The model is a real one whose fused kernel gets such a name: a chain of fourteen elementwise ONNX
ops, which the fused pipeline makes one kernel named after all of them.  It is run through
tvm_probe, compared with onnxruntime (passing) and with that reference shifted at one value
(failing: the "what failed" table then names the kernel too), and each report is measured in
the page: no cell's text reaches past its cell into a neighbour, numbers stay on one line.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper
from support.browser import Chromium, needs_chromium
from support.small_onnx import FLOAT, model, tensor

from tvm_probe import Probe, onnxruntime_values
from tvm_probe.comparison.verdict import compare
from tvm_probe.show.report import write_report

CHAIN = ["Sqrt", "Exp", "Neg", "Abs", "Sigmoid", "Tanh", "Reciprocal", "Floor", "Ceil", "Relu", "Softplus", "Erf",
         "Sin", "Cos"]
WIDTH = 1280  # a laptop's browser window, as test_report_page


def chain_model():
    """``x`` through every op of CHAIN, one after the other: one fused kernel."""
    nodes, previous = [], "x"
    for i, op in enumerate(CHAIN):
        out = f"layer_{i}/{op}"
        nodes.append(helper.make_node(op, [previous], [out], name=out))
        previous = out
    nodes.append(helper.make_node("Identity", [previous], ["y"]))
    return model(nodes, [tensor("x", FLOAT, [4, 8])], [tensor("y", FLOAT, [4, 8])])


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """{state: report folder}, and the kernel's symbol: the chain compared with onnxruntime
    (passing) and with its reference shifted at a middle value (failing)."""
    proto = chain_model()
    feeds = {"x": np.random.default_rng(0).random((4, 8), dtype=np.float32) + 0.5}
    probe = Probe.from_onnx(proto, target="llvm", pipeline="fused")
    probe.run(feeds)
    reference = onnxruntime_values(proto, feeds)
    tampered = {**reference, "layer_6/Reciprocal": reference["layer_6/Reciprocal"] + 1.0}
    folder = tmp_path_factory.mktemp("report_readable")
    for state, values in (("passing", reference), ("failing", tampered)):
        write_report(folder / state, probe, compare(probe, values), formats=("html",))
    (symbol,) = {n.symbol for n in probe.node_infos if n.op == "tvm_op"}
    return {"passing": folder / "passing", "failing": folder / "failing"}, symbol


# Every cell of every table, with every <details> open: the box of the cell's text (a Range over
# its contents: text that cannot wrap spills out of its cell, whose own box stays put) against
# the cell's and its right-hand neighbour's boxes, and how many lines the text takes.
MEASURE_CELLS = """(() => {
  document.querySelectorAll('details').forEach(d => d.open = true);
  const out = [];
  for (const table of document.querySelectorAll('table.data')) {
    for (const row of table.rows) {
      const cells = [...row.cells];
      cells.forEach((cell, i) => {
        const range = document.createRange();
        range.selectNodeContents(cell);
        const text = range.getBoundingClientRect(), box = cell.getBoundingClientRect();
        if (text.width === 0) return;  // an empty cell: nothing to read
        const next = cells[i + 1] ? cells[i + 1].getBoundingClientRect().left : null;
        const lines = new Set([...range.getClientRects()].filter(b => b.width > 0).map(b => Math.round(b.top)));
        out.push({table: table.closest('[id]').id, cls: cell.className, text: cell.textContent,
                  left: text.left, right: text.right, boxLeft: box.left, boxRight: box.right, next,
                  lines: lines.size});
      });
    }
  }
  return out;
})()"""


def _cells(folder) -> list[dict]:
    with Chromium((folder / "report.html").as_uri(), size=(WIDTH, 900)) as browser:
        browser.wait_for(r"Top 1 kernels by total time", r"Build notes")
        return browser.evaluate(MEASURE_CELLS)


def _check_readable(cells: list[dict], symbol: str) -> None:
    """No text past its cell's edges (nor into the next cell); numbers on one line; the kernel's
    name shown whole, wrapped at underscores."""
    spilled = [c for c in cells if c["right"] > c["boxRight"] + 0.5 or c["left"] < c["boxLeft"] - 0.5
               or (c["next"] is not None and c["right"] > c["next"] + 0.5)]
    assert spilled == [], spilled[:3]
    numbers = [c for c in cells if c["cls"] == "num" and c["text"]]
    assert numbers and all(c["lines"] == 1 for c in numbers), [c for c in numbers if c["lines"] != 1][:3]
    named = [c for c in cells if symbol in c["text"] and c["cls"] == "name"]
    assert {c["table"] for c in named} >= {"kernels", "nodes"}
    assert all(c["lines"] > 1 for c in named)  # wrapped, not cut


@needs_chromium
@pytest.mark.parametrize("state", ["passing", "failing"])
def test_long_kernel_names_keep_every_column_readable(reports, state):
    folders, symbol = reports
    assert len(symbol) >= 100 and symbol.count("_") > 20, symbol  # a real fused name, as long as the issue's
    cells = _cells(folders[state])
    _check_readable(cells, symbol)
    if state == "failing":  # the first divergent op's facts say which kernel computed it
        assert any(symbol in c["text"] and c["table"] == "first-divergent-facts" for c in cells)
