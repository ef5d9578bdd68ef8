"""One investigation, as a YAML config describes it: model → probe run → dump → compare → report.

This is what ``tvm-probe run CONFIG`` does; it is usable from Python too::

    outcome = investigate(load_config("configs/demo.yaml"))
    outcome.comparison.verdict(); outcome.exit_code
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .config import Config, ConfigError
from .errors import NameLookupError
from .progress import Progress

# Exit statuses of `tvm-probe` (the CLI adds 3 for internal errors).
EXIT_OK, EXIT_DIVERGED, EXIT_BAD_INPUT = 0, 1, 2


@dataclass
class Outcome:
    """What one investigation produced."""

    probe: object
    inputs: dict[str, np.ndarray]
    comparison: object | None = None
    dump: Path | None = None
    report: dict[str, Path] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """0 when every compared value is within tolerance (or nothing was compared), else 1."""
        return EXIT_OK if self.comparison is None or self.comparison else EXIT_DIVERGED


def investigate(config: Config, progress: Progress | None = None) -> Outcome:
    """Run the investigation ``config`` describes (see the module docstring)."""
    progress = progress or Progress(enabled=False)
    model = config.model.load_torch() if config.model.torch else config.model.load()
    probe, inputs = config_inputs(config, model, progress)
    capture = config.capture if config.capture is None or config.capture == "all" else list(config.capture)
    with progress.stage("run"):
        try:
            probe.run(inputs, capture=capture)
        except NameLookupError as err:  # a capture pattern that names nothing in this model
            raise ConfigError(f"{config.source}: capture: {err}") from None
    outcome = Outcome(probe=probe, inputs=inputs)
    if config.output.dump is not None:
        with progress.stage("dump"):
            outcome.dump = probe.dump(config.output.dump, overwrite=config.output.overwrite,
                                      metadata={"model": config.model.describe()})
    if config.reference.runtime != "none":
        outcome.comparison = _compare(config, probe, model, inputs, progress)
    if config.output.report is not None:
        from .report import write_report

        with progress.stage("report"):
            outcome.report = write_report(config.output.report, probe, outcome.comparison,
                                          formats=config.output.write)
    return outcome


def config_inputs(config: Config, model, progress: Progress):
    """Import and compile ``model`` as ``config`` says; return the probe and the run's inputs.

    ``model`` is an ``onnx.ModelProto``, or ``(module, example_inputs)`` for a torch config.
    """
    from .build import compile_with_snapshots
    from .kernel_map import build_kernel_map
    from .probe import Probe

    with progress.stage("import"):
        if config.model.torch:
            from .importer.torch import import_torch

            imported = import_torch(*model)
        else:
            from .importer.onnx import import_onnx

            imported = import_onnx(model, dict(config.model.shapes))
    with progress.stage(f"compile ({config.pipeline} pipeline, {config.target})"):
        built = compile_with_snapshots(imported.mod, config.target, config.pipeline)
        probe = Probe(imported, built, build_kernel_map(imported, built.snapshots))
    return probe, _inputs(config, probe, model)


def _inputs(config: Config, probe, model) -> dict[str, np.ndarray]:
    """Inputs from the config; the demo model fills in what the config leaves out."""
    specs = {s.name: s for s in probe.inputs}
    given = {src.name: src for src in config.inputs}
    unknown = [n for n in given if n not in specs]
    if unknown:
        raise ConfigError(f"{config.source}: inputs.{unknown[0]}: the model has no such input; "
                          f"its inputs are {', '.join(specs)}")
    missing = [n for n in specs if n not in given]
    defaults = {}
    if missing and config.model.torch:  # the factory's example inputs, in input order
        defaults = {n: np.asarray(t.detach().cpu().numpy()) for n, t in zip(specs, model[1])}
    elif missing:
        if config.model.demo is None:
            raise ConfigError(f"{config.source}: inputs.{missing[0]}: no values given: add "
                              f"'{missing[0]}: {{random: {{...}}}}' or '{{file: PATH}}' under inputs")
        from . import demo

        defaults = demo.demo_inputs(model)
    return {n: (given[n].load(specs[n]) if n in given else defaults[n]) for n in specs}


def _compare(config: Config, probe, model, inputs, progress):
    from .compare import compare

    ref_spec = config.reference
    with progress.stage(f"reference ({ref_spec.runtime})"):
        reference = reference_values(ref_spec, model, inputs)
    with progress.stage("compare") as stage:
        return compare(probe, reference, atol=ref_spec.atol, rtol=ref_spec.rtol,
                       tolerance_for=ref_spec.tolerance_for if ref_spec.tolerances else None,
                       progress=stage.update)


def reference_values(ref_spec, model, inputs) -> dict[str, np.ndarray]:
    """Reference values for every source value, from the runtime ``ref_spec`` names.

    ``model`` is an ``onnx.ModelProto`` or, for torch configs, ``(module, example_inputs)``.
    """
    is_torch = isinstance(model, tuple)
    if ref_spec.runtime == "onnxruntime" and not is_torch:
        from .reference.onnxruntime import onnxruntime_values

        return onnxruntime_values(ref_spec.model or model, inputs)
    if ref_spec.runtime == "torch" and is_torch:
        import torch

        from .reference.torch import torch_values

        module, _ = model
        return torch_values(module, tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in inputs.values()))
    kind = "a PyTorch" if is_torch else "an ONNX"
    fits = "torch" if is_torch else "onnxruntime"
    raise ConfigError(f"reference: {ref_spec.runtime!r} cannot run {kind} model: use reference: {fits}")
