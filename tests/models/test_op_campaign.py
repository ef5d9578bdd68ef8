"""The op campaign in CI: a fixed seeded sample of ``bench/campaign.py``'s cases.

Each case (``tests/support/campaign.py``) is run by plain TVM and by tvm_probe under the pipeline;
the property: tvm_probe runs every model plain TVM runs, every value is served equal to the
reference (onnxruntime / eager torch) or to plain TVM's own, or is an explicit unknown with a
one-line why, and ``get`` raises nothing else; every Split output is served on symbolic shapes
too.  The known failures are listed with their reason as strict xfails, so that they turn into
failures here the day they pass.
"""
from __future__ import annotations

import functools
import random

import pytest

from support.campaign import run_case
from support.campaign_onnx import onnx_cases
from support.campaign_torch import torch_cases
from tvm_probe.core.schema import PIPELINES

SEED = 36
# by case name: what fails today, and why
KNOWN_FAILING: dict[str, str] = {}
# named cases, always in the sample: this branch's fixes, and the classes the data-ops branch
# fixed (they were strict xfails here until it landed: data-dependent ops, shape values, None outputs)
NAMED = ("onnx/extra/unknown_rank_reshape_relu", "onnx/extra/split3_dyn", "onnx/extra/unsqueeze_axes_input_dyn",
         "onnx/extra/shape_gather_concat_reshape_dyn", "torch/inplace_input_add_", "onnx/test_nonzero_example",
         "onnx/extra/unknown_rank_shape", "onnx/test_shape", "torch/return_none", "torch/masked_select",
         "torch/one_hot", "onnx/test_split_to_sequence_2@const", "onnx/test_split_to_sequence_2@dyn",
         "onnx/test_split_variable_parts_2d_opset18@dyn", "onnx/test_slice",
         "onnx/test_slice_start_out_of_bounds@const")


# drawn by draw_sample(SEED) and written down, so that collecting the tests builds no case
DRAWN = (
    "onnx/test_less_equal_expanded@dyn", "onnx/test_attention_3d_with_past_and_present_qk_matmul_bias_expanded@dyn",
    "onnx/test_argmax_no_keepdims_random_select_last_index@dyn", "onnx/test_hardmax_axis_2",
    "onnx/test_attention_4d_causal_padded_kv_bf16@const", "onnx/test_abs@dyn", "onnx/test_reduce_min_bool_inputs@const",
    "onnx/test_slice_neg_steps@dyn", "torch/inplace_input_clamp_", "torch/logsumexp", "torch/matmul_t",
    "torch/softplus",
)
SAMPLE = tuple(dict.fromkeys(DRAWN + NAMED + tuple(KNOWN_FAILING)))


def draw_sample(seed: int = SEED) -> list[str]:
    """8 ONNX node-test cases and 4 torch cases."""
    # (the cases with an If came after the draw: named below, not drawn, so that it stays the same)
    names = [c.name for c in onnx_cases() if not any(n.op_type == "If" for n in c.make()[0].graph.node)]
    names += [c.name for c in torch_cases()]
    node_tests = sorted(n for n in names if "/test_" in n)
    torch_ops = sorted(n for n in names if n.startswith("torch/"))
    rng = random.Random(seed)
    return rng.sample(node_tests, 8) + rng.sample(torch_ops, 4)


@functools.lru_cache(maxsize=1)
def _cases() -> dict:
    return {c.name: c for c in onnx_cases() + torch_cases()}


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("name", [
    pytest.param(n, id=n, marks=[pytest.mark.xfail(strict=True, reason=KNOWN_FAILING[n])]
                 if n in KNOWN_FAILING else []) for n in SAMPLE])
def test_tvm_probe_runs_and_serves_what_plain_tvm_does(name, pipeline):
    outcome = run_case(_cases()[name], pipeline)
    assert outcome.problems == [], f"{name} [{pipeline}]: {outcome.problems}"
    if outcome.ran_plain:
        assert outcome.equal == outcome.compared


def test_the_sample_is_the_seeded_draw_and_every_case_exists():
    assert list(DRAWN) == draw_sample(SEED)
    assert set(SAMPLE) <= set(_cases())


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("name", [
    "onnx/test_split_equal_parts_2d@dyn",
    # parts of sizes [2, 4] of an n-length axis: legalization writes T.min(2, n) as 2
    "onnx/test_split_variable_parts_2d_opset18@dyn",
    # a sequence output, every element (and the sequence as one value) served
    "onnx/test_split_to_sequence_2@dyn", "onnx/test_split_to_sequence_1@const",
    # a Slice whose bounds are inputs: R.Tensor(ndim=3) in the import, sizes named at legalization
    "onnx/test_slice"])
def test_every_output_of_a_split_on_symbolic_shapes_is_served(name, pipeline):
    outcome = run_case(_cases()[name], pipeline)
    assert outcome.ran_plain and outcome.problems == []
    assert not outcome.unknown, outcome.unknown
    assert outcome.compared == outcome.equal > 0


# -- If results, empty values, a Shape with start > end; every value against plain TVM's own ----
# (each served value is held to plain TVM built with that value as an output: an ONNX graph with
# every node output a graph output, a torch.export program returning every intermediate tensor)
VALUE_CASES = ("onnx/test_if", "onnx/test_slice_start_out_of_bounds@const",
               "onnx/test_shape_start_greater_than_end@dyn", "torch/mlp", "torch/max_dim")


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("name", VALUE_CASES)
def test_every_value_is_served_equal_to_plain_tvms_own(name, pipeline):
    outcome = run_case(_cases()[name], pipeline)
    assert outcome.ran_plain and outcome.problems == [], f"{name} [{pipeline}]: {outcome.plain or outcome.problems}"
    assert not outcome.unknown, outcome.unknown
    assert outcome.compared and outcome.equal == outcome.compared
    assert outcome.against_tvm == outcome.compared  # each one held to plain TVM's value, not only the reference's
