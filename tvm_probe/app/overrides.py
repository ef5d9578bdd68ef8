"""Config keys set from the command line: ``--set KEY=VALUE`` and the flags that stand for keys.

``tvm-probe run``'s ``--shapes``, ``--inputs``, ``--pipeline`` and ``--target`` are overrides of
``model.shapes``, ``inputs``, ``pipeline`` and ``target``, each remembered as the user wrote it
(:class:`Override`), so that a problem with one names the flag, and a remedy the flag or key
(:class:`~tvm_probe.core.errors.Terms`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.errors import ConfigError, Terms, one_line


@dataclass(frozen=True)
class Override:
    """A config key set from the command line: ``item`` is ``key.path=YAML value``; ``flag`` how the
    user wrote it (``--set pipeline=fused``, ``--shapes x=1x4``), which a problem with it names."""

    item: str
    flag: str

    @classmethod
    def of(cls, given: "str | Override") -> "Override":
        """A ``--set KEY=VALUE`` item as an Override (an Override as it is)."""
        return given if isinstance(given, Override) else cls(given, f"--set {given}")



def apply_overrides(data: dict, overrides) -> dict:
    """Apply each override to ``data``; key path → the Override that set it."""
    overridden = {}
    for given in overrides:
        override = Override.of(given)
        overridden[_apply_override(data, override)] = override
    return overridden


def _apply_override(data: dict, override: Override) -> tuple:
    """Set ``key.path=value`` (the value is YAML) in ``data``; return the key path."""
    import yaml

    item = override.item
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"{override.flag}: is not KEY=VALUE (e.g. --set pipeline=fused)")
    target = data
    parts = key.strip().split(".")
    for part in parts[:-1]:
        nxt = target.get(part)
        if not isinstance(nxt, dict):
            nxt = target[part] = {}
        target = nxt
    try:
        target[parts[-1]] = yaml.safe_load(raw)
    except yaml.YAMLError:
        raise ConfigError(f"{override.flag}: the value is not valid YAML") from None
    return tuple(parts)


#: The flags of ``tvm-probe run`` that stand for config keys (a remedy names them).
RUN_FLAGS = frozenset({"--shapes", "--inputs", "--pipeline", "--target", "--set"})


def run_terms(config) -> Terms:
    """The command line's terms for a run of ``config``: its flags, its file and lines."""
    return Terms(RUN_FLAGS, str(config.source) if config.source is not None else None, config.lines)


def run_overrides(args) -> list:
    """``run``'s flags as config overrides, each remembered as the user wrote it."""
    overrides = [Override.of(item) for item in args.overrides]
    for name, sizes in shapes_flags(args.shapes).items():
        overrides.append(Override(f"model.shapes.{name}={list(sizes)}", f"--shapes {name}={'x'.join(map(str, sizes))}"))
    if args.inputs is not None:
        overrides.append(Override(f"inputs={json.dumps(_input_files(args.inputs))}", f"--inputs {args.inputs}"))
    for key in ("pipeline", "target"):
        if getattr(args, key) is not None:
            overrides.append(Override(f"{key}={json.dumps(getattr(args, key))}", f"--{key} {getattr(args, key)}"))
    if args.verify:
        overrides.append(Override("verify=true", "--verify"))
    return overrides


def _input_files(path: Path) -> dict:
    """``--inputs F.npz``: the config's inputs, one per array of the file (by its name)."""
    if path.suffix.lower() != ".npz" or not path.is_file():
        problem = "does not exist" if not path.is_file() else "is not an .npz file"
        raise ConfigError(f"--inputs {path}: {problem}: give an .npz of arrays named as the model's inputs "
                          "(numpy.savez(F, input_ids=..., ...))")
    try:
        with np.load(path, allow_pickle=False) as arrays:
            names = list(arrays.files)
    except (OSError, ValueError) as err:
        raise ConfigError(f"--inputs {path}: cannot read it ({one_line(err)}): give an .npz file") from None
    return {name: {"file": str(path.resolve()), "key": name} for name in names}


def shapes_flags(given: list[str]) -> dict[str, tuple[int, ...]]:
    """``--shapes NAME=AxB`` flags as ``shapes=``."""
    shapes = {}
    for flag in given:
        name, _, dims = flag.partition("=")
        try:
            sizes = tuple(int(d) for d in dims.split("x"))
        except ValueError:
            sizes = ()
        if not name or not sizes or any(d <= 0 for d in sizes):
            raise ConfigError(f"--shapes {flag}: give an input's name and its sizes, e.g. --shapes x=1x3x224x224")
        shapes[name] = sizes
    return shapes
