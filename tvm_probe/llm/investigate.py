"""``tvm-probe run`` with ``model: {hf: ...}`` and ``generate:``: build, generate, compare every step."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..core.errors import InputError
from ..core.schema import Exit
from ..probe import Probe
from ..probe.generate import Generation
from .compare import GenerationComparison, compare_generation
from .render import layer_passed, layer_svg, layer_table


@dataclass
class GenerationOutcome:
    """What ``tvm-probe run`` did for a ``generate:`` config (see :func:`investigate_generation`)."""

    probe: Any
    generation: Generation
    comparison: GenerationComparison
    report: dict = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """OK only when every value of every step passed and every token agrees."""
        return Exit.OK if self.comparison else Exit.DIVERGED

    def lines(self) -> list[str]:
        """What the CLI prints: the tokens, the step × layer errors, the files, the verdict."""
        import pandas as pd

        table = layer_table(self.comparison)
        with pd.option_context("display.width", 200, "display.float_format", "{:.2g}".format):
            shown = [table.to_string()] if not table.empty else []
        files = [f"{kind}: {path}" for kind, path in self.report.items()]
        return [f"tokens: {self.generation.tokens}", f"transformers (eager, same cache, fed the tokens above): "
                f"{self.comparison.reference_tokens}", *shown, *files, self.comparison.verdict()]


def investigate_generation(config, progress) -> GenerationOutcome:
    """Build the probe the config names (``Probe.from_hf``), generate, compare every step, write
    the tables (``config.output.report``)."""
    spec = config.generate
    with progress.stage("import and compile (prefill, decode)"):
        model = config.model.load()
        prompt = _config_prompt(spec, model)
        probe = Probe.from_hf(model, pipeline=config.pipeline, target=config.target,
                              max_len=prompt.shape[1] + spec.steps, import_fixes=config.import_fixes)
    with progress.stage(f"generate {spec.steps} tokens"):
        probe.generate(prompt, steps=spec.steps)
    with progress.stage("reference and compare"):
        comparison = compare_generation(probe, atol=config.reference.atol, rtol=config.reference.rtol)
    outcome = GenerationOutcome(probe=probe, generation=probe.hf.generations[-1], comparison=comparison)
    if config.output.report is not None:
        folder = config.output.report
        folder.mkdir(parents=True, exist_ok=True)
        comparison.table().to_csv(folder / "steps.csv", index=False)
        table = layer_table(comparison)
        table.to_csv(folder / "step_layer_errors.csv")
        (folder / "step_layer_errors.svg").write_text(layer_svg(table, layer_passed(comparison)), encoding="utf-8")
        outcome.report = {"steps": folder / "steps.csv", "table": folder / "step_layer_errors.csv",
                          "plot": folder / "step_layer_errors.svg"}
    return outcome


def _config_prompt(spec, model) -> np.ndarray:
    vocab = model.config.get_text_config(decoder=True).vocab_size
    if spec.prompt != "random":
        if max(spec.prompt) >= vocab:
            raise InputError(f"generate.prompt: token id {max(spec.prompt)} is outside the vocabulary (size {vocab})")
        return np.array([list(spec.prompt)], np.int64)
    return np.random.default_rng(spec.seed).integers(0, vocab, size=(1, spec.length), dtype=np.int64)
