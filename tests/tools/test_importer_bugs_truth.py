"""The ground truth behind ``blame``'s "importer" verdict (tests/support/importer_bugs.py): real cases
where TVM 0.27's ONNX frontend folds a value to a wrong constant at import time.  The experiments,
re-run here with plain TVM and onnxruntime, must still show it:

* onnxruntime's values are the ONNX spec's (checked against numpy on the model's own inputs);
* TVM's graph outputs differ from onnxruntime's;
* the imported Relax module (before any pass) already holds the wrong value as a bool constant,
  equal to neither onnxruntime's value of the first wrong tensor;
* the values feeding the first wrong node are right in TVM, and what TVM computes downstream is
  exactly its kernel applied to that wrong constant — so no TVM kernel and no pass made the error.

If TVM is upgraded and a case is fixed, these fail: re-run ``support.importer_bugs.experiment(name)``
and drop the case (or record the fix) in ``importer_bugs.py`` / ``importer_bugs.md``.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from support.importer_bugs import IMPORTER_BUGS, ImporterBug, experiment

NAMES = sorted(IMPORTER_BUGS)


def _spec_value(name: str) -> np.ndarray:
    """The ONNX spec's value of the first wrong tensor, computed with numpy from the model's inputs."""
    _, inputs = IMPORTER_BUGS[name].build()
    if name == "equal_shape_const":
        return np.array(inputs["x"].shape) == np.array([3, 5])
    if name == "equal_shape_shape_symbolic":
        return np.array(inputs["x"].shape) == np.array(inputs["y"].shape)
    if name == "equal_batch_symbolic":
        return np.array(inputs["x"].shape[0:1]) == np.array([1])
    raise KeyError(name)


@pytest.fixture(scope="module")
def observations():
    return {name: experiment(name) for name in NAMES}


def test_table_is_well_formed():
    assert NAMES
    for name, bug in IMPORTER_BUGS.items():
        assert isinstance(bug, ImporterBug), name
        assert bug.upstream == "found here" or re.fullmatch(r"apache/tvm#\d+", bug.upstream), name
        assert bug.note.strip() and bug.first_wrong_tensor, name
        model, inputs = bug.build()
        names = [n.name for n in model.graph.node]
        assert all(names) and len(set(names)) == len(names), name
        assert all(n.startswith("bug/") for n in names), name
        node = next(n for n in model.graph.node if n.name == bug.first_wrong_node)
        assert node.op_type == "Equal" and list(node.output) == [bug.first_wrong_tensor], name
        assert set(inputs) == {i.name for i in model.graph.input}, name
        again = bug.build()[1]                                         # seeded
        assert all(np.array_equal(inputs[k], again[k]) for k in inputs), name


@pytest.mark.parametrize("name", NAMES)
def test_onnxruntime_follows_the_spec(observations, name):
    obs = observations[name]
    assert np.array_equal(obs["onnxruntime_first_wrong"], _spec_value(name))


@pytest.mark.parametrize("name", NAMES)
def test_tvm_differs_from_onnxruntime(observations, name):
    obs = observations[name]
    assert len(obs["tvm"]) == len(obs["onnxruntime"])
    assert any(t.shape != o.shape or not np.array_equal(t, o)
               for t, o in zip(obs["tvm"], obs["onnxruntime"]))


@pytest.mark.parametrize("name", NAMES)
def test_imported_module_already_holds_the_wrong_constant(observations, name):
    obs = observations[name]
    const = obs["imported_constant"]
    assert const is not None and const.dtype == np.bool_
    right = obs["onnxruntime_first_wrong"]
    assert const.shape == right.shape and not np.array_equal(const, right)
    # the printed module: the line that uses it is a plain constant, no Relax op computes it
    line = obs["imported_text_line"]
    assert 'metadata["ir.GenericConst"]' in line and line in obs["imported_text"]
    assert "R.equal" not in obs["imported_text"]


@pytest.mark.parametrize("name", NAMES)
def test_the_error_starts_at_the_folded_equal(observations, name):
    obs = observations[name]
    # what feeds the Equal (the Shape/Slice outputs) is right in TVM ...
    assert obs["upstream_right"]
    # ... and TVM's kernel downstream (Not) computes exactly from the wrong constant
    assert np.array_equal(obs["tvm"][0], np.logical_not(obs["imported_constant"]))
    assert np.array_equal(obs["onnxruntime"][0], np.logical_not(obs["onnxruntime_first_wrong"]))
