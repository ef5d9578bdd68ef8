"""The LLM stage: a generation of a ``Probe.from_hf`` probe against eager transformers (docs/llm.md).

``reference_generate`` (:mod:`.reference`), ``compare_generation`` (:mod:`.compare`), the step ×
layer table and plot (:mod:`.render`), the ``tvm-probe run`` job (:mod:`.investigate`);
:mod:`.hf` (also ``tvm_probe.llm.hf``) gathers every LLM name, the export and generation included.
"""
from .compare import GenerationComparison, compare_generation
from .investigate import GenerationOutcome, investigate_generation
from .reference import ReferenceGeneration, reference_generate
from .render import layer_svg, layer_table

__all__ = ["GenerationComparison", "GenerationOutcome", "ReferenceGeneration", "compare_generation",
           "investigate_generation", "layer_svg", "layer_table", "reference_generate"]
