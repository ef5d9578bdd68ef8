"""nn.GRU under ``fused``: values kept inside the gate kernels are recomputed, equal to eager.

FoldConstant folds the ``split`` of the GRU's weights into a tuple literal of constants; the
module after FuseOps passes the fused gate kernel ``lv25[0]``, ``lv25[1]``, ... (Vars bound to
items of that tuple), and the compiled call passes the constants themselves.  The recompute plan
follows such a Var to its constant (``kernel_map/mapping.py``: ``_constant_behind``), so the cut
is fed what the compiled call was fed; before, ``get`` raised ``TVMBehaviourChanged`` ("its
parameter 1 matches no argument of the compiled call") for 84 names.  A parameter still fed from
nowhere the call shows is an explicit unknown (``ValueUnavailableError``, with why), not a crash.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.campaign_torch import eager_values  # noqa: E402
from tvm_probe import Probe  # noqa: E402
from tvm_probe.core.schema import PIPELINES  # noqa: E402
from tvm_probe.core.sources import Served  # noqa: E402


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_every_gru_value_is_served_equal_to_eager(pipeline):
    torch.manual_seed(0)
    gru = torch.nn.GRU(4, 5, batch_first=True).eval()
    x = torch.randn(1, 3, 4, generator=torch.Generator().manual_seed(1))
    probe = Probe.from_torch(gru, (x,), pipeline=pipeline)
    probe.run([x.numpy()])
    reference = eager_values(gru, (x,))
    served = {k: s.served for k, s in probe.servings.items()}
    assert Served.UNKNOWN not in served.values()
    if pipeline == "fused":
        assert sum(s is Served.RECOMPUTED for s in served.values()) >= 10
    compared = 0
    for key, how in served.items():
        if how in (Served.INPUT, Served.UNAVAILABLE) or key not in reference:
            continue
        np.testing.assert_allclose(probe.get_tensor(key), reference[key], atol=1e-5, err_msg=f"{key} ({how.value})")
        compared += 1
    assert compared >= 60
