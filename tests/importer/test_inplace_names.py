"""In-place copies: a name is served only from a node that computes *its* op on *its* values.

``torch.export`` makes ``y.copy_(w)`` a functional ``copy = aten.copy.default(mul, w)``; TVM's
converter also writes ``w`` into ``mul``'s slot of its ``env``, so a name read from the final
``env`` served ``w`` for ``mul``.  Circular ``F.pad`` decomposes into slices and such copies
(``slice_3``, ``slice_10``, ... are their destinations).  Every value a probe serves here is
checked against eager PyTorch running the exported program node by node; a destination whose
value before the copy the compiled module no longer computes must say so, never serve the copy.
"""
from __future__ import annotations

import numpy as np
import pytest

from tvm_probe.core.schema import PIPELINES

torch = pytest.importorskip("torch")

from support.campaign_torch import eager_values  # noqa: E402
from tvm_probe.importer.torch import export_program, node_keys  # noqa: E402
from tvm_probe import Probe, ValueUnavailableError  # noqa: E402
from tvm_probe.core.sources import Served  # noqa: E402

ATOL = 1e-5
NOT_SERVED = (Served.UNKNOWN, Served.UNAVAILABLE)


class CopyBuffer(torch.nn.Module):
    """The reported case: ``mul``'s own value is needed nowhere after the copy."""

    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.full((2, 3), 5.0))

    def forward(self, x):
        y = x * 2
        y.copy_(self.w)
        return y + 1


class CopyParameterBroadcast(torch.nn.Module):
    """A parameter of another shape (the copy broadcasts it), the copy itself returned."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([5.0, 6.0, 7.0]))

    def forward(self, x):
        y = x * 2
        y.copy_(self.w)
        return y


class CopyAfterUse(torch.nn.Module):
    """``mul`` is read before the copy, so the compiled module computes it: it must be x * 2."""

    def forward(self, x):
        y = x * 2
        z = y.sin()
        y.copy_(x + 1)
        return y * z


class CircularPad(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.pad(x, (1, 1, 1, 1), mode="circular")


MODELS = {
    "copy_buffer": (CopyBuffer, (2, 3)),
    "copy_parameter_broadcast": (CopyParameterBroadcast, (2, 3)),
    "copy_after_use": (CopyAfterUse, (2, 3)),
    "circular_pad": (CircularPad, (1, 2, 4, 4)),
}


def copy_destinations(module, args) -> dict[str, str]:
    """Source key of each copy's destination → the copy node's name."""
    program = export_program(module, args)
    keys = node_keys(program)
    return {keys[n.args[0]]: n.name for n in program.graph.nodes
            if n.op == "call_function" and n.target in (torch.ops.aten.copy.default, torch.ops.aten.copy_.default)}


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("name", MODELS)
def test_every_served_value_is_its_own_nodes_eager_value(name, pipeline):
    cls, shape = MODELS[name]
    module = cls().eval()
    args = (torch.randn(*shape, generator=torch.Generator().manual_seed(0)),)
    probe = Probe.from_torch(module, args, pipeline=pipeline)
    probe.run([a.numpy() for a in args])
    reference = eager_values(module, args)
    destinations = copy_destinations(module, args)
    assert destinations, f"{name}: export made no copy"

    served = [k for k, s in probe.servings.items() if s.served not in NOT_SERVED]
    assert len(served) >= 3
    for key in served:
        np.testing.assert_allclose(probe.get_tensor(key), reference[key], atol=ATOL,
                                   err_msg=f"{name} {pipeline} {key} ({probe.served(key).value})")

    # only a copy's destination may go unserved, and it says why: its value before the copy is gone
    unserved = sorted(k for k, s in probe.servings.items() if s.served in NOT_SERVED)
    assert set(unserved) <= set(destinations), f"{name} {pipeline}: {unserved}"
    for key in unserved:
        why = f"fx node '{destinations[key]}' .* writes into it in place"
        with pytest.raises(ValueUnavailableError, match=why) as err:
            probe.get_tensor(key)
        assert "please report" not in str(err.value)

    # the copy's destination is x * 2 wherever it is served, never the copied value
    if "mul" in destinations:
        np.testing.assert_allclose(reference["mul"], args[0].numpy() * 2)
        if probe.servings["mul"].served not in NOT_SERVED:
            np.testing.assert_allclose(probe.get("mul"), args[0].numpy() * 2, atol=ATOL)
    if name == "copy_after_use":  # sin reads it: the compiled module computes it, so it is served
        assert probe.servings["mul"].served not in NOT_SERVED
