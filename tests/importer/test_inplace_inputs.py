"""In-place ops on a *user input* are probed as plain TVM runs them.

``torch.export`` functionalizes ``x.add_(1)`` in ``forward``: the input's new value is an fx node
(``add``) like any other, and the program lists the input in ``user_inputs_to_mutate``.  TVM's
importer returns the user outputs, right; nothing is dropped that a later call would need (the
caller passes the input again), so tvm_probe runs such a program and serves every value, held
here to eager PyTorch node by node and to plain TVM's outputs (``support.campaign``).  A program
that mutates a *buffer* stays refused (``tests/models/test_llm_generate.py``): TVM would drop that
state.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.campaign import run_case  # noqa: E402
from support.campaign_torch import torch_cases  # noqa: E402
from tvm_probe import ModelError, Probe  # noqa: E402
from tvm_probe.core.schema import PIPELINES  # noqa: E402

CASES = {c.name.removeprefix("torch/inplace_input_"): c for c in torch_cases() if c.cls == "in-place on input"}
REPORTED = ("add_", "relu6_", "fill_", "index_put_", "copy_")  # the ops of the report


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("op", REPORTED)
def test_an_inplace_op_on_an_input_runs_with_every_value_equal_to_eager(op, pipeline):
    outcome = run_case(CASES[op], pipeline)
    assert outcome.plain == "", f"plain TVM failed: {outcome.plain}"
    assert outcome.problems == [], outcome.problems
    assert not outcome.unknown and outcome.compared >= 2 and outcome.equal == outcome.compared


def test_the_inputs_new_value_is_served_and_the_callers_array_is_left_alone():
    class AddInPlace(torch.nn.Module):
        def forward(self, x):
            x.add_(1)
            return x * 2

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    probe = Probe.from_torch(AddInPlace(), (torch.from_numpy(x.copy()),))
    out = probe.run({"x": x})
    np.testing.assert_array_equal(probe.get("add"), x + 1)  # the input's new value
    np.testing.assert_array_equal(list(out.values())[0], (x + 1) * 2)
    np.testing.assert_array_equal(x, np.arange(6, dtype=np.float32).reshape(2, 3))


def test_a_buffer_mutation_next_to_an_input_mutation_is_still_refused():
    class Both(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("seen", torch.zeros(3))

        def forward(self, x):
            self.seen.add_(x)
            x.mul_(2)
            return x + self.seen

    with pytest.raises(ModelError, match=r"^Both mutates 1 buffer\(s\) \(seen\), whose updates TVM's importer drops"):
        Probe.from_torch(Both(), (torch.ones(3),))
