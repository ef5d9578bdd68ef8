"""Calls the VM makes that are no compiled kernel: packed functions (``relax.run.nonzero`` for
NonZero, Compress, Unique and ``masked_select``; ``relax.run.assert_op`` for ``F.one_hot``), and
functions of the module (``torch.cond``'s branches).  They are known kinds of calls, not a
``TVMBehaviourChanged``: a data-dependent op is a call site whose output is served at whatever
size the run produced, and so are the values after it."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto
from onnx import helper as h
from support.small_onnx import FLOAT, check_model, model, tensor

from tvm_probe import Probe
from tvm_probe.core.schema import PIPELINES


def nonzero_model():
    return model([h.make_node("Relu", ["x"], ["r"], name="relu"),
                  h.make_node("NonZero", ["r"], ["nz"], name="nonzero"),
                  h.make_node("Cast", ["nz"], ["c"], name="cast", to=FLOAT),
                  h.make_node("Neg", ["c"], ["y"], name="neg")],
                 [tensor("x", FLOAT, [2, 3])], [tensor("y", FLOAT, [2, "k"])])


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_nonzero_is_a_call_site_served_at_each_runs_size(pipeline):
    proto = nonzero_model()
    probe = Probe.from_onnx(proto, pipeline=pipeline)
    site = probe.kernel_map.sites[probe.kernel_map.places["nz"].site]
    assert site.symbol == "relax.run.nonzero" and site.packed
    rng = np.random.default_rng(0)
    sizes = set()
    for _ in range(3):  # the first run goes through TVM's instrument, later ones through hooks
        x = rng.standard_normal((2, 3)).astype("float32")
        got = check_model(probe, proto, {"x": x}, pipeline, served={"r", "nz", "c", "y"})
        np.testing.assert_array_equal(got["nz"], np.stack(np.nonzero(np.maximum(x, 0))))
        sizes.add(got["nz"].shape[1])
    assert len(sizes) > 1, "the runs should have produced outputs of different sizes"


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_compress_and_unique(pipeline):
    compress = model([h.make_node("Relu", ["x"], ["r"], name="relu"),
                      h.make_node("Compress", ["r", "keep"], ["y"], name="compress", axis=0)],
                     [tensor("x", FLOAT, [4, 3]), tensor("keep", TensorProto.BOOL, [4])],
                     [tensor("y", FLOAT, ["k", 3])])
    feeds = {"x": np.arange(12, dtype="float32").reshape(4, 3) - 5, "keep": np.array([1, 0, 1, 1], bool)}
    check_model(Probe.from_onnx(compress, pipeline=pipeline), compress, feeds, pipeline, served={"r", "y"})
    unique = model([h.make_node("Relu", ["x"], ["r"], name="relu"),
                    h.make_node("Unique", ["r"], ["u"], name="unique", sorted=1),
                    h.make_node("Neg", ["u"], ["y"], name="neg")],
                   [tensor("x", FLOAT, [6])], [tensor("y", FLOAT, ["k"])])
    feeds = {"x": np.array([1, -2, 3, 1, 3, 0], "float32")}
    check_model(Probe.from_onnx(unique, pipeline=pipeline), unique, feeds, pipeline, served={"r", "u", "y"})


class MaskedSelect(torch.nn.Module):
    def forward(self, x):
        return torch.masked_select(x, x > 0) + 1


class OneHot(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.one_hot(x, 5).float() * 2


class Cond(torch.nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,)) * 3


def _torch_case(module, x, pipeline, names):
    """The module run by tvm_probe: its output equals eager torch's; ``names`` (fx node name →
    eager value) are served and equal."""
    probe = Probe.from_torch(module, (x,), pipeline=pipeline)
    for _ in range(2):
        outputs = probe.run([x.numpy()])
        np.testing.assert_allclose(list(outputs.values())[0], module(x).numpy(), rtol=1e-5, atol=1e-6)
        for name, expected in names.items():
            np.testing.assert_allclose(probe.get(name), expected, rtol=1e-5, atol=1e-6, err_msg=name)
    return probe


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_masked_select_one_hot_and_cond(pipeline):
    x = torch.tensor([[-1.0, 2.0, 0.5], [3.0, -0.5, -2.0]])
    probe = _torch_case(MaskedSelect(), x, pipeline, {"masked_select": torch.masked_select(x, x > 0).numpy()})
    assert any(s.symbol == "relax.run.nonzero" for s in probe.kernel_map.sites)
    ids = torch.tensor([0, 3, 1, 4])
    onehot = torch.nn.functional.one_hot(ids, 5)
    expected = {"_to_copy_1": onehot.float().numpy(), "mul": onehot.float().numpy() * 2}
    probe = _torch_case(OneHot(), ids, pipeline, expected)
    assert sum(s.symbol == "relax.run.assert_op" for s in probe.kernel_map.sites) == 2
    for x in (x, -x):  # both branches
        branch = (x.sin() if x.sum() > 0 else x.cos()).numpy()
        probe = _torch_case(Cond(), x, pipeline, {"gt": np.array(bool(x.sum() > 0)), "getitem": branch,
                                                  "mul": Cond()(x).numpy()})
        assert probe.servings["getitem"].served.value == "passed"  # the If's result, as the kernel after it reads it
