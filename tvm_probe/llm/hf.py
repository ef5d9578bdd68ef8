"""``tvm_probe.llm.hf`` (this module): every name of the LLM work in one place, as docs/llm.md uses them.

The work itself lives by stage: the export with a functional KV cache and the import of prefill
and decode in :mod:`tvm_probe.importer.hf`; greedy generation through the probe in
:mod:`tvm_probe.probe.generate`; the eager reference (:mod:`.reference`), the comparison
(:mod:`.compare`), the step × layer table and plot (:mod:`.render`) and the ``tvm-probe run`` job
(:mod:`.investigate`) in :mod:`tvm_probe.llm`.

    from tvm_probe.llm.hf import compare_generation, reference_generate
"""
from __future__ import annotations

from ..core.schema import DEFAULT_PIPELINE, DEFAULT_TARGET
from ..importer.hf import (
    DECODE, PREFILL, CacheShape, HFModel, cache_shape, cache_step_class, example_decode, import_decode, import_hf,
    import_prefill, make_cache_step, merge_functions, positions,
)
from ..probe import Probe
from ..probe.generate import Generation, generate, prompt_ids
from .compare import GenerationComparison, compare_generation
from .investigate import GenerationOutcome
from .investigate import investigate_generation as _investigate
from .reference import ModuleRecorder, ReferenceGeneration, reference_generate
from .render import layer_svg, layer_table

__all__ = [
    "DECODE", "PREFILL", "CacheShape", "Generation", "GenerationComparison", "GenerationOutcome", "HFModel",
    "ModuleRecorder", "ReferenceGeneration", "cache_shape", "cache_step_class", "compare_generation",
    "example_decode", "from_hf", "generate", "import_decode", "import_hf", "import_prefill", "investigate_generation",
    "layer_svg", "layer_table", "make_cache_step", "merge_functions", "positions", "prompt_ids", "reference_generate",
]

#: the names these had before the stages became packages (tests and scripts import them)
_example_decode, _positions, _prompt, _merge = example_decode, positions, prompt_ids, merge_functions


def from_hf(probe_class=Probe, model=None, pipeline=DEFAULT_PIPELINE, target=DEFAULT_TARGET, max_len: int = 64,
            import_fixes: bool = True):
    """``probe_class.from_hf(model, ...)`` (the signature this module's ``from_hf`` had)."""
    return probe_class.from_hf(model, pipeline=pipeline, target=target, max_len=max_len, import_fixes=import_fixes)


def investigate_generation(config, progress, probe_class=None) -> GenerationOutcome:
    """:func:`tvm_probe.llm.investigate.investigate_generation` (``probe_class`` is no longer
    needed: call that one with ``(config, progress)``)."""
    return _investigate(config, progress)
