"""A model file given to ``tvm-probe run`` instead of a config: the config it stands for.

    tvm-probe run model.onnx --shapes input_ids=1x128 --write-config model.yaml

The file becomes ``model: {onnx: PATH}``, its inputs random from the model's own types, the
kind's default reference, dump and report under ``./tvm_probe_out/<model stem>/``; the flags are
overrides of those keys, validated as a YAML config is; ``--write-config`` writes the YAML.
"""
from __future__ import annotations

import os
from pathlib import Path

from .config import Config, ConfigError, config_from_data


#: The model files ``tvm-probe run`` takes without a config, by suffix: their config kind.
MODEL_FILE_KINDS = {".onnx": "onnx", ".tflite": "tflite", ".pt2": "torch"}
#: Where a model file's run writes, under the working folder: ``OUTPUT_ROOT/<model stem>/``.
OUTPUT_ROOT = Path("tvm_probe_out")


def model_file_data(model: Path) -> dict:
    """The config a model file stands for (before overrides): the file, random inputs from the
    model's own types (a saved torch program: its example inputs), the kind's default reference, dump and report under
    ``tvm_probe_out/<model stem>/`` (replaced by the next run of the same model)."""
    kind = MODEL_FILE_KINDS.get(model.suffix.lower())
    if kind is None:
        raise ConfigError(f"'{model}' is neither a YAML config nor a model file tvm-probe run takes "
                          f"({', '.join(MODEL_FILE_KINDS)}): give one of those")
    if not model.is_file():
        raise ConfigError(f"model file '{model}' does not exist: check the path")
    out = OUTPUT_ROOT / model.stem
    data = {"model": {kind: str(model.resolve())}, "inputs": "random",
            "output": {"dump": str((out / "dump").resolve()), "report": str((out / "report").resolve()),
                       "overwrite": True}}
    if kind == "torch":  # a saved program holds the inputs it was exported with: those
        del data["inputs"]
    return data


def config_for_model(model, overrides=()) -> tuple[Config, dict]:
    """The validated config ``tvm-probe run MODEL_FILE`` runs (see :func:`model_file_data`) and the
    data it was made of (what ``--write-config`` writes)."""
    data = model_file_data(Path(model))
    return config_from_data(data, overrides), data


def write_config(data: dict, path, command: str) -> Path:
    """Write ``data`` (a config's keys) as a YAML config at ``path``, paths relative to its folder."""
    import yaml

    path = Path(path)
    folder = path.resolve().parent
    relative = _with_relative_paths(data, folder)
    text = (f"# The config of: {command}\n# Run it with: tvm-probe run {path}   (every key: configs/example.yaml)\n"
            + yaml.safe_dump(relative, sort_keys=False, default_flow_style=None))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"--write-config {path}: cannot write it ({err.strerror}): give a writable path") from None
    return path


def _with_relative_paths(data, folder: Path):
    """``data`` with every absolute path in it relative to ``folder`` (a config's paths are
    relative to its own folder)."""
    if isinstance(data, dict):
        return {k: _with_relative_paths(v, folder) for k, v in data.items()}
    if isinstance(data, list):
        return [_with_relative_paths(v, folder) for v in data]
    if isinstance(data, str) and os.path.isabs(data):
        return os.path.relpath(data, folder)
    return data
