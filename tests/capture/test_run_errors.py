"""Blame where it belongs: ``TVMRunError`` only for what TVM raised (with TVM's words); a failure
of tvm_probe's own code during a run is an ``InternalError`` asking for a report, and the run
values are served from is left as it was."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import helper as h
from support.relax_models import refusing_module
from support.small_onnx import FLOAT, INT64, model, tensor

from tvm_probe import Probe
from tvm_probe.capture.transfer import Transfers
from tvm_probe.core.errors import InternalError, ProbeError, TVMError, TVMRunError, raised_by_tvm



def test_what_tvm_raised_is_tvms():
    import tvm

    with pytest.raises(Exception) as raised:  # a real error of TVM's runtime, through its FFI
        tvm.get_global_func("relax.run.nonzero")("not a tensor")
    assert raised_by_tvm(raised.value)
    assert not raised_by_tvm(TypeError("'int' object is not iterable"))
    probe = Probe.from_relax(refusing_module("tvm_probe_tests.refuse_in_run_errors")[0])
    with pytest.raises(TVMRunError, match="the custom kernel refuses its input"):
        probe.run({"x": np.ones(4, "float32")})


def shape_model():
    return model([h.make_node("Neg", ["x"], ["m"], name="neg"), h.make_node("Shape", ["m"], ["s"], name="shape")],
                 [tensor("x", FLOAT, ["n", 3])], [tensor("m", FLOAT, ["n", 3]), tensor("s", INT64, [2])])


def test_our_own_failure_is_an_internal_error_and_the_last_run_stays(monkeypatch, tmp_path):
    probe = Probe.from_onnx(shape_model())
    first = np.ones((2, 3), "float32")
    probe.run({"x": first})

    def broken(result, times):  # a bug of ours while reading the result back (as issue 36 had)
        raise TypeError("'int' object is not iterable")

    monkeypatch.setattr(Transfers, "fetch_outputs", staticmethod(broken))
    with pytest.raises(InternalError) as raised:
        probe.run({"x": np.zeros((5, 3), "float32")})
    error = raised.value
    assert not isinstance(error, (TVMError, ProbeError))
    assert "'int' object is not iterable" in str(error) and "please report it" in str(error)
    assert "not in TVM" in str(error)
    monkeypatch.undo()
    np.testing.assert_array_equal(probe.get("m"), -first)  # the run served is the one that completed
    np.testing.assert_array_equal(probe.get("s"), [2, 3])
    probe.dump(tmp_path / "dump")
    from tvm_probe import load_dump

    np.testing.assert_array_equal(load_dump(tmp_path / "dump").get("m"), -first)
