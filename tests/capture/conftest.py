"""Shared by the capture tests: the demo BERT probed once per module and pipeline."""
from __future__ import annotations

import pytest

from tvm_probe import Probe
from tvm_probe.core.schema import PIPELINES
from tvm_probe.core.sources import Served


@pytest.fixture(scope="module", params=PIPELINES)
def probed(request, bert_model, bert_inputs):
    """A probe after one run capturing everything (through TVM's instrument), its outputs, and
    every value it served then."""
    probe = Probe.from_onnx(bert_model, pipeline=request.param)
    outputs = probe.run(bert_inputs)
    served = {v.key: probe.get_tensor(v.key) for v in probe.sources_map
              if probe.servings[v.key].served in (Served.CAPTURED, Served.RECOMPUTED)}
    return probe, outputs, served
