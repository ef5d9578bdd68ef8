"""Weight-only quantization of LLMs as MLC-LLM deploys it (issue 34): ``Probe.from_hf(quantize=)``
and ``sensitivity_hf``.

The reference is independent of tvm_probe's quantizer: this file writes MLC's formula itself in
numpy (:func:`_dequantized`), loads the dequantized weights into a copy of the eager
transformers model, and every module path at every step of the TVM build (which unpacks the
uint32 words and scales them in its own kernels) must equal that model's output.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tvm_probe import InputError, Probe, ProbeError  # noqa: E402
from tvm_probe.core.sources import Kind  # noqa: E402
from tvm_probe.importer.quantize import QuantSpec  # noqa: E402
from tvm_probe.llm import compare_generation, reference_generate  # noqa: E402
from tvm_probe.tools.quantization.llm import sensitivity_hf  # noqa: E402

from support.hf_models import decoder_ids, hf_decoder  # noqa: E402

STEPS, PROMPT, GROUP = 4, 8, 32


def _dequantized(w: np.ndarray, bits: int = 4, group: int = GROUP) -> np.ndarray:
    """MLC's symmetric group quantization, written out: scale = max|w| / (2^(b-1) - 1) per group
    of ``group`` inputs, q = clip(round(w / scale) + max_int, 0, 2 max_int), w' = (q - max_int) scale."""
    max_int = 2 ** (bits - 1) - 1
    g = w.astype(np.float32).reshape(w.shape[0], -1, group)
    scale = np.abs(g).max(-1, keepdims=True) / np.float32(max_int)
    safe = np.where(scale == 0, 1, scale)
    q = np.clip(np.round(g / safe) + max_int, 0, 2 * max_int)
    return ((q - max_int) * scale).reshape(w.shape).astype(np.float32)


def _quantizable(model) -> dict:
    """Module path → module: every nn.Linear and the token embedding."""
    embedding = model.get_input_embeddings()
    return {p: m for p, m in model.named_modules() if isinstance(m, torch.nn.Linear) or m is embedding}


def _eager_with_dequantized_weights(model):
    eager = copy.deepcopy(model)
    with torch.no_grad():
        for module in _quantizable(eager).values():
            module.weight.copy_(torch.from_numpy(_dequantized(module.weight.numpy())))
    return eager


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_q4f32_1_every_module_path_at_every_step_equals_eager_with_the_dequantized_weights(family):
    model, ids = hf_decoder(family), decoder_ids(0, batch=1, seq=PROMPT)
    probe = Probe.from_hf(model, quantize="q4f32_1", max_len=32)
    tokens = probe.generate(ids, steps=STEPS)
    eager = _eager_with_dequantized_weights(model)
    result = compare_generation(probe, reference_generate(eager, ids, STEPS))
    assert result, result.verdict()
    assert tokens == result.reference_tokens
    table = result.table()
    assert (table["compared"] > 20).all() and (table["diverged"] == 0).all()
    for call in range(STEPS):
        names = {v.name for v in result.calls.by_call[call].comparison.values}
        assert {"module:model.layers.0.self_attn", "module:model.layers.1.mlp", "module:lm_head"} <= names
    # the model itself as reference= (teacher-forced with the generation's tokens): the same verdict,
    # and against the float original the quantized build is not within tolerance
    assert compare_generation(probe, reference=eager), "reference=model"
    assert not compare_generation(probe, reference=model)

    # the packed weights are what the executable takes; the float weight is computed in its kernels
    decode = probe.functions["decode"].imported
    params = dict(decode.params)
    for path, module in _quantizable(model).items():
        rows, cols = module.weight.shape
        assert (params[f"{path}.q_weight"].dtype, params[f"{path}.q_weight"].shape) == ("uint32", (rows, cols // 8))
        assert (params[f"{path}.q_scale"].dtype, params[f"{path}.q_scale"].shape) == ("float32", (rows, cols // GROUP))
        assert f"{path}.weight" not in params and decode.sources[f"{path}.weight"].kind is Kind.VALUE
    name = "model.layers.1.mlp.down_proj"
    served = probe.get(f"{name}.weight", call=STEPS - 1)
    np.testing.assert_allclose(served, _dequantized(model.model.layers[1].mlp.down_proj.weight.detach().numpy()),
                               rtol=1e-6, atol=1e-7)
    # the prefill and the decode steps share one device copy of each held weight
    q_name = f"{name}.q_weight"
    held = [p.imported.held[[n for n, _ in p.imported.params].index(q_name)] for p in probe.functions.values()]
    assert held[0] is held[1]


def test_q4f16_1_computes_in_fp16_and_generates():
    model, ids = hf_decoder("llama"), decoder_ids(0, batch=1, seq=PROMPT)
    dtype_before = model.lm_head.weight.dtype
    probe = Probe.from_hf(model, quantize="q4f16_1", max_len=32)
    assert model.lm_head.weight.dtype == dtype_before  # the user's model is left as it was
    tokens = probe.generate(ids, steps=STEPS)
    assert len(tokens) == STEPS and all(0 <= t < model.config.vocab_size for t in tokens)
    assert probe.get("lm_head", call=0).dtype == np.float16
    assert probe.get("model.layers.0.self_attn", call=STEPS - 1).dtype == np.float16
    assert "matmul_half_result" in [f.name for f in probe.import_fixes]
    params = dict(probe.functions["decode"].imported.params)
    assert params["lm_head.q_scale"].dtype == "float16" and params["lm_head.q_weight"].dtype == "uint32"
    # against the float model: the same names per step, fp16 and 4-bit error and all
    result = compare_generation(probe)
    assert len(result.table()) == STEPS


class _HalfProducts(torch.nn.Module):
    """mm, addmm (a Linear with bias) and bmm in float16, each result concatenated with a half tensor."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x, y):
        z = self.linear(x) + x @ self.linear.weight  # addmm, mm
        w = torch.bmm(y, y.transpose(1, 2))
        return torch.cat([z, x], -1), torch.cat([w, y], -1)


def test_the_fix_matmul_half_result_keeps_torchs_dtype_for_fp16_products():
    torch.manual_seed(0)
    module = _HalfProducts().eval().half()
    args = (torch.randn(4, 8).half(), torch.randn(2, 3, 3).half())
    probe = Probe.from_torch(module, args)
    assert [f.name for f in probe.import_fixes] == ["matmul_half_result"]
    outputs = probe.run([a.numpy() for a in args])
    with torch.no_grad():
        expected = module(*args)
    for got, want in zip(outputs.values(), expected):
        assert got.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float32), want.float().numpy(), atol=2e-2, rtol=1e-2)
    with pytest.raises(ProbeError):  # TVM's plain import: float32 products, refused by cat
        Probe.from_torch(module, args, import_fixes=False)


def test_a_bad_quantize_gives_one_line_listing_the_presets():
    with pytest.raises(InputError) as err:
        Probe.from_hf(hf_decoder("llama"), quantize="q3f16_1")
    message = str(err.value)
    assert "\n" not in message and "q4f16_1" in message and "q4f32_1" in message and "'q3f16_1'" in message
    with pytest.raises(InputError, match="bits=3"):
        QuantSpec(bits=3)
    with pytest.raises(InputError, match="no quantizable module at"):
        Probe.from_hf(hf_decoder("llama"), quantize=QuantSpec(skip=["model.layers.9.mlp"]))


def _plant_outliers(model, layer: int) -> str:
    """Outlier weights in ``model.layers.<layer>.mlp.down_proj``: one input column per group of
    32 set to 1.0 (weights are ~0.02), where the float model feeds zeros (those rows of
    ``up_proj`` are zeroed), so the float model barely changes while each group's scale grows
    ~50-fold and the layer's other weights quantize to zero; the layer's weights are tripled so
    that its output matters to the residual stream of this tiny random model."""
    mlp = model.model.layers[layer].mlp
    cols = torch.arange(0, mlp.down_proj.weight.shape[1], GROUP)
    with torch.no_grad():
        mlp.up_proj.weight[cols] = 0
        mlp.down_proj.weight.mul_(3)
        mlp.down_proj.weight[:, cols] = 1.0
    return f"model.layers.{layer}.mlp.down_proj"


def test_a_layer_with_planted_outlier_weights_ranks_first_and_is_kept_in_float():
    model, ids = hf_decoder("llama"), decoder_ids(0, batch=1, seq=PROMPT)
    planted = _plant_outliers(model, layer=1)
    report = sensitivity_hf(model, "q4f32_1", prompt=ids, steps=6)
    table = report.table()
    assert list(table.columns) == ["module", "alone_kl", "alone_first_diff", "kept_float_kl", "kept_float_first_diff"]
    assert sorted(table["module"]) == sorted(_quantizable(model))  # one row per quantized module
    assert table["module"][0] == planted, table
    assert table["alone_kl"][0] > 2 * table["alone_kl"][1]
    row = table.set_index("module").loc[planted]
    assert row["kept_float_kl"] < report.quantized.kl  # keeping it in float helps
    assert report.timings["runs"] == 2 * len(table) + 2  # float, quantized, alone and kept per module

    assert report.quantized.first_diff is not None  # fully quantized, the greedy tokens differ
    kept = report.keep_float(steps=6)
    assert planted in kept
    # an independent check of keep_float's promise: a plain build with those modules skipped
    # generates the float model's greedy tokens
    probe = Probe.from_hf(model, quantize=QuantSpec(skip=kept), max_len=32)
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
    assert probe.generate(ids, steps=6) == expected[0, PROMPT:].tolist()
