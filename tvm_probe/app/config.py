"""YAML configs: one file describes an investigation; validated whole before any work starts.

Schema (``configs/example.yaml`` shows every key with comments)::

    model:      {onnx: PATH, shapes: {input: [dims]}}  |  {demo: {preset: tiny|bert-base, <size>: ...}}
                |  {tflite: PATH, shapes: {input: [dims]}}
                |  {torch: "FILE.py:FUNCTION" or "package.module:FUNCTION"}  (returns (module, example_inputs))
                |  {torch: PROGRAM.pt2}  (saved by torch.export.save, with its example inputs)
                |  {hf: "FILE.py:FUNCTION"}  (returns a transformers *ForCausalLM; needs generate:)
    generate:   {prompt: [ids] | random, steps: N, seed: S, length: L}   (model: {hf: ...} only)
    inputs:     {NAME: {random: {seed, shape, dtype, low, high}} | {file: PATH.npy|PATH.npz, key: K}}
                | random   (every input random, from its type: ids within the table they index)
    target:     llvm
    pipeline:   default | fused
    capture:    all | [NAME or PATTERN, ...]
    reference:  none | onnxruntime | torch | tflite | {runtime: ..., model: PATH, atol: X, rtol: X,
                                      tolerances: {PATTERN: {atol: X, rtol: X}}}
                | {tvm: {pipeline: default|fused, target: T}, atol: ..., ...}   (another TVM build)
                (atol/rtol default by dtype, see tvm_probe.core.tolerance)
    output:     {dump: DIR, report: DIR, write: [csv, html, graph], overwrite: false, weights: false}
    split:      {cuts: [NAME, SCOPE or PATTERN, ...]} | {balance: N}     (tvm-probe split)
    verify:     false | true   (check every served value against an independent unfused build)
    import_fixes: true | false (rewrite constructs TVM 0.27 cannot build; see tvm_probe.importer.fixes)
    remote:     {host: HOST, port: PORT} | {tracker: "HOST:PORT", key: KEY}   (run on a `tvm-probe serve`)
    precision:  fp16 | {dtype: fp16, keep_fp32: [NAME, ...]}   (build in reduced precision; tvm_probe.tools.precision)
    quantization: {model: QDQ.onnx, target_sqnr: DB}   (model: {onnx: FLOAT}; `run` compares the QDQ model
                with it op by op, ranks the ops, writes the tables to output.report; tvm_probe.tools.quantization)

Every problem is reported with its file, line and key path (or the ``--set`` that made it), all
at once, in one line: ``configs/x.yaml:7: reference.atol: must be a number >= 0, got -1``.  Relative paths are
relative to the config file's folder.  CLI ``--set key.path=value`` overrides and the flags that
stand for keys (``--shapes``, ``--inputs``, ``--pipeline``, ``--target``: :class:`Override`) go
through the same validation, so options and YAML keys are one schema.  A model file given to
``tvm-probe run`` stands for a config (:mod:`tvm_probe.app.model_file`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..capture.remote.spec import parse_remote, remote_problems
from ..comparison.terms import VerdictTerms
from ..comparison.reference import (
    NO_REFERENCE,
    TVM_BUILD,
    get_reference,
    is_no_reference,
    reference_for,
    reference_names,
)
from ..core.errors import ConfigError
from ..core.precision import PrecisionError, parse_precision, precision_tolerance
from ..core.schema import DEFAULT_PIPELINE, DEFAULT_TARGET, PIPELINE_NAMES, REPORT_FORMATS
from ..core.tolerance import Tolerance
from ..importer.demo import PRESETS, SIZES
from ..importer.kinds import ModelAdapter, adapter_for, adapters
from .overrides import apply_overrides

DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")


#: The kinds a config's ``model:`` takes, in the order its messages list them.
CONFIG_KINDS = ("onnx", "tflite", "demo", "torch", "hf")
_GIVEN = {"file": "PATH", "sizes": "{...}", "factory": "FILE.py:FUNCTION"}  # how each is written


@dataclass(frozen=True)
class ModelSpec:
    """Which model: its kind (the key of YAML ``model: {KIND: ...}``), what the config gives for it
    (a resolved file path, a ``"file.py:function"`` factory, the demo's sizes) and ``shapes:``.
    Loading and recording go through the kind's adapter (:mod:`tvm_probe.importer.kinds`)."""

    kind: str = "demo"
    source: Any = field(default_factory=dict)
    shapes: dict = field(default_factory=dict)

    @property
    def adapter(self) -> ModelAdapter:
        return adapter_for(self.kind)

    def load(self):
        """The model this spec names, as its importer takes it (an ``onnx.ModelProto``, the
        parsed TFLite model, ``(module, example_inputs)``, a transformers causal LM)."""
        return self.adapter.load(self.source, self.shapes)

    def describe(self) -> dict:
        """JSON-friendly description, stored in dumps so ``tvm-probe compare DUMP`` can reload it."""
        return self.adapter.record(self.source, self.shapes)


@dataclass(frozen=True)
class InputSource:
    """One input's values: random (seed, shape, dtype, range) or a .npy/.npz file."""

    name: str
    random: dict | None = None
    file: Path | None = None
    key: str | None = None

    def load(self, spec=None) -> np.ndarray:
        """The array; ``spec`` (the model's InputSpec) fills in a random input's shape/dtype (and,
        for ids that index a table, the range)."""
        if self.file is not None:
            return _load_array(self.file, self.key, self.name)
        opts = dict(self.random or {})
        declared = spec.shape if spec else ()
        if not opts.get("shape") and (declared is None or not all(isinstance(d, int) for d in declared)):
            shown = "no rank" if declared is None else f"shape {list(declared)}"
            raise ConfigError(f"inputs.{self.name}: the model declares it with {shown}: give "
                              f"'{self.name}: {{random: {{shape: [...]}}}}' or a file")
        shape = tuple(opts.get("shape") or declared)
        dtype = np.dtype(opts.get("dtype") or (spec.dtype if spec else "float32"))
        rng = np.random.default_rng(opts.get("seed", 0))
        low, high = opts.get("low", 0 if dtype.kind in "iub" else -1.0), opts.get("high")
        if high is None and dtype.kind in "iu" and getattr(spec, "index_bound", None):
            high = spec.index_bound  # ids: within the table the input indexes
        if dtype.kind == "b":
            return rng.integers(0, 2, size=shape).astype(bool)
        if dtype.kind in "iu":
            return rng.integers(low, high if high is not None else 2, size=shape, dtype=dtype)
        return rng.uniform(low, high if high is not None else 1.0, size=shape).astype(dtype)


@dataclass(frozen=True)
class GenerateSpec:
    """``generate:``: the prompt (token ids, or ``"random"``: ``length`` ids from ``seed``) and
    the number of new tokens; ``tvm-probe run`` compares every step (see :mod:`tvm_probe.llm.hf`)."""

    prompt: tuple | str = "random"
    steps: int = 1
    seed: int = 0
    length: int = 8


@dataclass(frozen=True)
class ReferenceSpec:
    """The reference runtime and tolerances.

    ``atol``/``rtol`` of None mean the default for each value's dtype
    (:func:`tvm_probe.core.tolerance.default_tolerance`); per-pattern overrides win, first match first.
    """

    runtime: str = "onnxruntime"   # a registered reference's name, or NO_REFERENCE ('none')
    model: Path | None = None
    build: dict | None = None   # runtime TVM_BUILD ('tvm'): {pipeline, target} of the reference build
    atol: float | None = None
    rtol: float | None = None
    tolerances: tuple[tuple[str, Tolerance], ...] = ()

    def terms(self, selection="default", precision: bool = False) -> VerdictTerms:
        """The terms a run's verdict is given on (what its dump records): this reference and
        tolerance; with ``precision`` (a reduced-precision build), float16's tolerance by default."""
        atol, rtol = self.atol, self.rtol
        if precision:
            atol, rtol = precision_tolerance(self).atol, precision_tolerance(self).rtol
        return VerdictTerms(reference=self.runtime, reference_options=dict(self.build or {}), atol=atol, rtol=rtol,
                            tolerances=self.tolerances, selection=selection)

    def tolerance_for(self, names) -> Tolerance | None:
        """The per-pattern tolerance of a value with these names, or None (use the default)."""
        return self.terms().tolerance_for(names)


@dataclass(frozen=True)
class OutputSpec:
    dump: Path | None = None
    report: Path | None = None
    write: tuple[str, ...] = REPORT_FORMATS
    overwrite: bool = False
    weights: bool = False   # keep the weights in the dump (so `tvm-probe get DUMP <weight>` works)


@dataclass(frozen=True)
class SplitSpec:
    """Where ``tvm-probe split`` cuts: named cuts, or ``balance`` cuts at layer boundaries."""

    cuts: tuple[str, ...] = ()
    balance: int | None = None


@dataclass(frozen=True)
class QuantizationSpec:
    """``quantization:``: the QDQ model of the config's (float) ONNX model, and the outputs' SQNR
    to reach by keeping ops in float (None: rank only)."""

    model: Path
    target_sqnr: float | None = None


@dataclass(frozen=True)
class Config:
    """A validated config (see the module docstring)."""

    model: ModelSpec
    inputs: tuple[InputSource, ...] = ()
    random_inputs: bool = False  # inputs: random (every input drawn from its type)
    target: str = DEFAULT_TARGET
    pipeline: str = DEFAULT_PIPELINE
    capture: Any = "all"
    reference: ReferenceSpec = ReferenceSpec()
    output: OutputSpec = OutputSpec()
    split: SplitSpec | None = None
    verify: bool = False    # check every served value against an independent unfused build
    import_fixes: bool = True  # rewrite constructs TVM 0.27 cannot build (importer/fixes.py)
    remote: Any = None      # a tvm_probe.capture.remote.RemoteSpec: run on a remote device over TVM RPC
    precision: Any = None   # a tvm_probe.core.precision.PrecisionSpec: build in reduced precision
    generate: Any = None    # a GenerateSpec: generate with a KV cache, compare every step (model: {hf: ...})
    quantization: Any = None  # a QuantizationSpec: the float model's QDQ model, compared and ranked
    source: Path | None = None
    overrides: tuple[str, ...] = ()
    lines: dict = field(default_factory=dict, compare=False)  # key path → line of the config file

    def at(self, *keys) -> str:
        """Where a key is, for messages: ``configs/x.yaml:7: inputs.x`` (the line of the key, else
        of its nearest parent); ``tvm-probe run: inputs.x`` for a model file's run."""
        name = ".".join(map(str, keys))
        if self.source is None:
            return f"tvm-probe run: {name}"
        line = next((self.lines[keys[:n]] for n in range(len(keys), 0, -1) if keys[:n] in self.lines), None)
        return f"{self.source}{f':{line}' if line else ''}: {name}"


# ------------------------------------------------------------------------------ loading
def load_config(path, overrides=()) -> Config:
    """Read, override (``key.path=value`` items or :class:`Override`\\ s) and validate a YAML
    config; raise ConfigError on any problem."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file '{path}' does not exist: check the path")
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
        lines = _key_lines(yaml.compose(text, Loader=yaml.SafeLoader))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file: give a YAML config") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{where}: not valid YAML ({getattr(err, 'problem', None) or err})") from None
    if data is None:
        raise ConfigError(f"{path}: the config is empty: it needs at least a 'model' key")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}:1: the config must be a mapping of keys (model, inputs, ...), "
                          f"not a {type(data).__name__}")
    return config_from_data(data, overrides, path, lines)


def config_from_data(data: dict, overrides=(), path: Path | None = None, lines: dict | None = None) -> Config:
    """Override and validate a config's keys (``data``, as YAML reads them; changed in place by the
    overrides).  ``path``: the YAML file they came from, whose ``lines`` locate a problem; None for
    a config made by the command line (a model file's: see :mod:`tvm_probe.app.model_file`)."""
    return _Validator(path, lines or {}, apply_overrides(data, overrides)).config(data)


def _key_lines(node, prefix=()) -> dict[tuple, int]:
    """Key path → 1-based line, from a composed YAML node tree."""
    import yaml

    lines = {prefix: node.start_mark.line + 1} if node is not None else {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            path = prefix + (str(key.value),)
            lines[path] = key.start_mark.line + 1
            lines.update({k: v for k, v in _key_lines(value, path).items() if k != path})
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines.update(_key_lines(item, prefix + (i,)))
    return lines


def _load_array(path: Path, key: str | None, name: str) -> np.ndarray:
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ConfigError(f"input {name!r}: cannot read '{path}' ({err}): give a .npy or .npz file") from None
    if isinstance(loaded, np.lib.npyio.NpzFile):
        with loaded:
            pick = key or (name if name in loaded.files else (loaded.files[0] if len(loaded.files) == 1 else None))
            if pick not in loaded.files:
                raise ConfigError(f"input {name!r}: '{path}' has arrays {loaded.files}: set 'key' to one of them")
            return loaded[pick]
    return loaded


class _Validator:
    """Checks every key of a parsed config, collecting every problem before raising."""

    def __init__(self, path: Path | None, lines: dict, overridden: dict | None = None):
        """``path`` None: a model file's config, made of defaults and flags (no file, no lines)."""
        self.path, self.lines, self.problems = path, lines, []
        self.overridden = overridden or {}   # key path → the Override that set it
        self.base = path.parent if path is not None else Path.cwd()

    def fail(self, keys: tuple, message: str) -> None:
        """Record a problem, located by its line in the file or by the --set that made it."""
        text = f"{'.'.join(map(str, keys)) or '(top)'}: {message}"
        setter = next((self.overridden[keys[:n]] for n in range(len(keys), 0, -1) if keys[:n] in self.overridden),
                      None)
        if setter is None and keys not in self.lines:  # a key the file lacks, made by a --set below it
            setter = next((item for path, item in self.overridden.items() if path[:len(keys)] == keys), None)
        if setter is not None:
            self.problems.append((0, setter.flag, text))
            return
        if self.path is None:
            self.problems.append((0, "tvm-probe run", text))
            return
        line = next((self.lines[keys[:n]] for n in range(len(keys), -1, -1) if keys[:n] in self.lines), 1)
        self.problems.append((line, f"line {line}", text))

    def config(self, data: dict) -> Config:
        known = ("model", "inputs", "target", "pipeline", "capture", "reference", "output", "split", "verify",
                 "import_fixes", "remote", "precision", "generate", "quantization")
        self.unknown_keys(data, (), known)
        is_hf = isinstance(data.get("model"), dict) and "hf" in data["model"]
        if "model" not in data:
            self.fail(("model",), "missing: give {onnx: PATH}, {tflite: PATH} or {demo: {...}}")
        model = self.model(data.get("model")) if "model" in data else None
        cfg = Config(
            model=model or ModelSpec(),
            inputs=self.inputs(data.get("inputs") or {}) if data.get("inputs") != "random" else (),
            random_inputs=data.get("inputs") == "random",
            target=self.string(data, ("target",), DEFAULT_TARGET),
            pipeline=self.choice(data, ("pipeline",), PIPELINE_NAMES, DEFAULT_PIPELINE),
            capture=self.capture(data.get("capture", "all")),
            reference=self.reference(data.get("reference", (model or ModelSpec()).adapter.reference)),
            output=self.output(data.get("output") or {}),
            split=self.split(data["split"]) if "split" in data else None,
            verify=self.flag(data, ("verify",)),
            import_fixes=self.flag(data, ("import_fixes",), True),
            remote=self.remote(data["remote"]) if data.get("remote") is not None else None,
            precision=self.precision(data.get("precision")),
            generate=self.generate(data.get("generate"), is_hf),
            quantization=self.quantization(data["quantization"], model) if "quantization" in data else None,
            source=self.path,
            overrides=tuple(o.flag for o in self.overridden.values()),
            lines=self.lines,
        )
        self.compatible(cfg)
        if self.problems:
            self.problems.sort()
            if len(self.problems) == 1:
                line, where, text = self.problems[0]
                raise ConfigError(f"{where}: {text}" if not line else f"{self.path}:{line}: {text}")
            shown = "; ".join(f"{where}: {text}" for _, where, text in self.problems)
            raise ConfigError(f"{self.path or 'the run'} has {len(self.problems)} problems: {shown}")
        return cfg

    # -- helpers ------------------------------------------------------------------------------
    def unknown_keys(self, mapping: dict, keys: tuple, known) -> None:
        for k in mapping:
            if k not in known:
                self.fail(keys + (k,), f"unknown key; valid keys here: {', '.join(known)}")

    def mapping(self, value, keys: tuple) -> dict | None:
        if not isinstance(value, dict):
            self.fail(keys, f"must be a mapping, got {type(value).__name__}")
            return None
        return value

    def string(self, data: dict, keys: tuple, default: str) -> str:
        value = data.get(keys[-1], default)
        if not isinstance(value, str) or not value:
            self.fail(keys, f"must be a non-empty string, got {value!r}")
            return default
        return value

    def choice(self, data: dict, keys: tuple, choices, default: str) -> str:
        value = data.get(keys[-1], default)
        if value not in choices:
            self.fail(keys, f"must be one of {', '.join(choices)}, got {value!r}")
            return default
        return value

    def number(self, data: dict, keys: tuple, default: float | None) -> float | None:
        value = data.get(keys[-1], default)
        if value is None and default is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            self.fail(keys, f"must be a number >= 0, got {value!r}")
            return default
        return float(value)

    def flag(self, data: dict, keys: tuple, default: bool = False) -> bool:
        value = data.get(keys[-1], default)
        if not isinstance(value, bool):
            self.fail(keys, f"must be true or false, got {value!r}")
            return default
        return value

    def compatible(self, cfg: Config) -> None:
        """What the sections say together: checked now, not after a long compile."""
        kind, runtime = cfg.model.kind, cfg.reference.runtime
        if not is_no_reference(runtime) and not get_reference(runtime).runs(kind):
            self.fail(("reference",), f"{runtime!r} cannot run {adapter_for(kind).described}: use reference: "
                                      f"{reference_for(kind).name}")
        if cfg.quantization is not None:  # both models built here as given, compared with onnxruntime
            for key in ("precision", "remote", "split"):
                if getattr(cfg, key) is not None:
                    self.fail((key,), "cannot go with quantization: (the float and QDQ models are built on this "
                                      f"machine as they are): remove '{key}'")

    def resolve(self, value: str) -> Path:
        """A config path: relative ones are relative to the config file's folder."""
        return Path(os.path.normpath(self.base / value))

    def existing_file(self, value, keys: tuple) -> Path | None:
        if not isinstance(value, str) or not value:
            self.fail(keys, f"must be a file path, got {value!r}")
            return None
        path = self.resolve(value)
        if not path.is_file():
            self.fail(keys, f"file '{path}' does not exist")
            return None
        return path

    def out_dir(self, value, keys: tuple) -> Path | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            self.fail(keys, f"must be a folder path, got {value!r}")
            return None
        return self.resolve(value)

    # -- sections -----------------------------------------------------------------------------
    def model(self, value) -> ModelSpec | None:
        keys = ("model",)
        if self.mapping(value, keys) is None:
            return None
        given = {a.kind: a for a in adapters() if a.config}
        self.unknown_keys(value, keys, (*CONFIG_KINDS, "shapes"))
        if sum(k in value for k in CONFIG_KINDS) != 1:
            self.fail(keys, "give exactly one of " + ", ".join(f"'{k}: {_GIVEN[given[k].config]}'"
                                                               for k in CONFIG_KINDS[:-1])
                      + f" or '{CONFIG_KINDS[-1]}: {_GIVEN[given[CONFIG_KINDS[-1]].config]}'")
            return None
        kind = next(k for k in CONFIG_KINDS if k in value)
        adapter, where = given[kind], keys + (kind,)
        if adapter.config == "factory":
            source = self.factory(value[kind], where)
        elif adapter.config == "file":
            source = self.existing_file(value[kind], where)
        else:
            source = self.sizes(value[kind] or {}, where)
        if source is None:
            return None
        return ModelSpec(kind, source, self.shapes(value, keys) if adapter.shapes else {})

    def shapes(self, value, keys: tuple) -> dict:
        shapes = value.get("shapes") or {}
        if self.mapping(shapes, keys + ("shapes",)) is None:
            return {}
        clean = {}
        for name, dims in shapes.items():
            if not (isinstance(dims, list) and all(isinstance(d, int) and d > 0 for d in dims)):
                self.fail(keys + ("shapes", name), f"must be a list of positive integers, got {dims!r}")
            else:
                clean[name] = tuple(dims)
        return clean

    def sizes(self, demo, keys: tuple) -> dict | None:
        """The demo's sizes (``model: {demo: {preset:, layers:, ...}}``)."""
        if self.mapping(demo, keys) is None:
            return None
        self.unknown_keys(demo, keys, ("preset",) + SIZES)
        if demo.get("preset", "tiny") not in PRESETS:
            self.fail(keys + ("preset",), f"must be one of {', '.join(PRESETS)}, got {demo.get('preset')!r}")
        for size in SIZES:
            if size in demo and (isinstance(demo[size], bool) or not isinstance(demo[size], int) or demo[size] < 0):
                self.fail(keys + (size,), f"must be a non-negative integer, got {demo[size]!r}")
        return dict(demo)

    def factory(self, value, keys: tuple) -> str | None:
        """``"FILE.py:FUNCTION"`` (the file resolved against the config's folder),
        ``"package.module:FUNCTION"``, or (torch) a program saved by ``torch.export.save``."""
        if isinstance(value, str) and value.endswith(".pt2") and keys[-1] == "torch":
            path = self.existing_file(value, keys)
            return str(path) if path else None
        where, sep, func = value.rpartition(":") if isinstance(value, str) else ("", "", "")
        if not sep or not where or not func.isidentifier():
            self.fail(keys, f"must be 'FILE.py:FUNCTION' or 'package.module:FUNCTION', got {value!r}")
            return None
        if where.endswith(".py"):
            path = self.existing_file(where, keys)
            return f"{path}:{func}" if path else None
        return value

    # -- generate (issue 24): a self-contained block ------------------------------------------
    def generate(self, value, is_hf: bool):
        """``generate: {prompt: [ids] | random, steps: N, seed: S, length: L}`` (model: {hf: ...})."""
        keys = ("generate",)
        if value is None:
            if is_hf:
                self.fail(keys, "missing: a model: {hf: ...} config needs generate: {prompt: [ids] or random, "
                                "steps: N}")
            return None
        if not is_hf:
            self.fail(keys, "needs model: {hf: FILE.py:FUNCTION} (a transformers causal LM)")
            return None
        if self.mapping(value, keys) is None:
            return None
        self.unknown_keys(value, keys, ("prompt", "steps", "seed", "length"))
        prompt = value.get("prompt", "random")
        if prompt != "random" and not (isinstance(prompt, list) and prompt
                                       and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                               for t in prompt)):
            self.fail(keys + ("prompt",), f"must be a list of token ids (ints >= 0) or 'random', got {prompt!r}")
            prompt = "random"
        ints = {}
        for key, default, low in (("steps", None, 1), ("seed", 0, 0), ("length", 8, 1)):
            got = value.get(key, default)
            if isinstance(got, bool) or not isinstance(got, int) or got < low:
                self.fail(keys + (key,), f"must be an integer >= {low}, got {got!r}")
                got = low
            ints[key] = got
        return GenerateSpec(prompt=tuple(prompt) if prompt != "random" else "random", **ints)

    def quantization(self, value, model: ModelSpec | None) -> QuantizationSpec | None:
        """``quantization: {model: QDQ.onnx, target_sqnr: DB}`` beside ``model: {onnx: FLOAT}``."""
        keys = ("quantization",)
        if self.mapping(value, keys) is None:
            return None
        self.unknown_keys(value, keys, ("model", "target_sqnr"))
        if model is not None and model.kind != "onnx":
            self.fail(keys, f"compares an ONNX model with its QDQ model: give model: {{onnx: FLOAT.onnx}}, "
                            f"not a {model.kind} model")
        if "model" not in value:
            self.fail(keys + ("model",), "missing: the QDQ model (quantize_static(..., QuantFormat.QDQ))")
            return None
        path = self.existing_file(value["model"], keys + ("model",))
        target = value.get("target_sqnr")
        if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float))):
            self.fail(keys + ("target_sqnr",), f"must be a number of dB, got {target!r}")
            target = None
        return QuantizationSpec(path, float(target) if target is not None else None) if path else None

    def inputs(self, value) -> tuple[InputSource, ...]:
        keys = ("inputs",)
        if isinstance(value, str):
            self.fail(keys, f"must be a mapping of input names, or random; got {value!r}")
            return ()
        if self.mapping(value, keys) is None:
            return ()
        sources = []
        for name, spec in value.items():
            here = keys + (name,)
            if self.mapping(spec, here) is None:
                continue
            self.unknown_keys(spec, here, ("random", "file", "key"))
            if ("random" in spec) == ("file" in spec):
                self.fail(here, "give exactly one of 'random: {...}' or 'file: PATH'")
                continue
            if "file" in spec:
                sources.append(InputSource(name, file=self.existing_file(spec["file"], here + ("file",)),
                                           key=spec.get("key")))
                continue
            rnd = spec["random"] or {}
            if self.mapping(rnd, here + ("random",)) is None:
                continue
            self.unknown_keys(rnd, here + ("random",), ("seed", "shape", "dtype", "low", "high"))
            if "dtype" in rnd and rnd["dtype"] not in DTYPES:
                self.fail(here + ("random", "dtype"), f"must be one of {', '.join(DTYPES)}, got {rnd['dtype']!r}")
            if "shape" in rnd and not (isinstance(rnd["shape"], list)
                                       and all(isinstance(d, int) and d >= 0 for d in rnd["shape"])):
                self.fail(here + ("random", "shape"), f"must be a list of non-negative integers, got {rnd['shape']!r}")
            for bound in ("low", "high", "seed"):
                if bound in rnd and (isinstance(rnd[bound], bool) or not isinstance(rnd[bound], (int, float))):
                    self.fail(here + ("random", bound), f"must be a number, got {rnd[bound]!r}")
            sources.append(InputSource(name, random=dict(rnd)))
        return tuple(sources)

    def capture(self, value):
        # Names and patterns are checked against the model once it is imported.
        if value == "all" or value is None:
            return value
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            self.fail(("capture",), f"must be 'all' or a list of names/patterns, got {value!r}")
            return "all"
        return tuple(value)

    def reference(self, value) -> ReferenceSpec:
        keys = ("reference",)
        if isinstance(value, str) or value is None:
            value = {"runtime": value or NO_REFERENCE}
        if self.mapping(value, keys) is None:
            return ReferenceSpec()
        self.unknown_keys(value, keys, ("runtime", "model", TVM_BUILD, "atol", "rtol", "tolerances"))
        build = self.reference_build(value[TVM_BUILD], keys + (TVM_BUILD,)) if TVM_BUILD in value else None
        runtime = TVM_BUILD if build is not None else self.choice(value, keys + ("runtime",), reference_names(),
                                                                  "onnxruntime")
        if runtime == TVM_BUILD and build is None:
            build = {"pipeline": DEFAULT_PIPELINE, "target": DEFAULT_TARGET}
        model = self.existing_file(value["model"], keys + ("model",)) if "model" in value else None
        tolerances = []
        per = value.get("tolerances") or {}
        if self.mapping(per, keys + ("tolerances",)) is not None:
            for pattern, tol in per.items():
                here = keys + ("tolerances", pattern)
                if self.mapping(tol, here) is None:
                    continue
                self.unknown_keys(tol, here, ("atol", "rtol"))
                tolerances.append((str(pattern), Tolerance(self.number(tol, here + ("atol",), 0.0),
                                                           self.number(tol, here + ("rtol",), 0.0))))
        return ReferenceSpec(runtime=runtime, model=model, build=build,
                             atol=self.number(value, keys + ("atol",), None),
                             rtol=self.number(value, keys + ("rtol",), None), tolerances=tuple(tolerances))

    def reference_build(self, value, keys: tuple) -> dict | None:
        """``tvm: {pipeline, target}``: another TVM build of the same model as the reference."""
        value = value or {}
        if self.mapping(value, keys) is None:
            return None
        self.unknown_keys(value, keys, ("pipeline", "target"))
        return {"pipeline": self.choice(value, keys + ("pipeline",), PIPELINE_NAMES, DEFAULT_PIPELINE),
                "target": self.string(value, keys + ("target",), DEFAULT_TARGET)}

    def output(self, value) -> OutputSpec:
        keys = ("output",)
        if self.mapping(value, keys) is None:
            return OutputSpec()
        self.unknown_keys(value, keys, ("dump", "report", "write", "overwrite", "weights"))
        write = value.get("write", list(REPORT_FORMATS))
        if isinstance(write, str):
            write = [write]
        if not isinstance(write, list) or any(w not in REPORT_FORMATS for w in write):
            self.fail(keys + ("write",), f"must be a list of {', '.join(REPORT_FORMATS)}, got {write!r}")
            write = list(REPORT_FORMATS)
        return OutputSpec(dump=self.out_dir(value.get("dump"), keys + ("dump",)),
                          report=self.out_dir(value.get("report"), keys + ("report",)),
                          write=tuple(write), overwrite=self.flag(value, keys + ("overwrite",)),
                          weights=self.flag(value, keys + ("weights",)))

    def precision(self, value):
        """``precision: fp16 | {dtype: fp16, keep_fp32: [names]}`` (the checks of tvm_probe.core.precision;
        the names are checked against the model once it is imported)."""

        try:
            return parse_precision(value)
        except PrecisionError as err:
            self.fail(("precision",), str(err).removeprefix("precision").lstrip(": "))
            return None

    def remote(self, value):
        """``remote: {host, port}`` or ``{tracker, key}`` (the checks of tvm_probe.capture.remote)."""

        problems = remote_problems(value)
        for keys, text in problems:
            self.fail(("remote",) + keys, text)
        return None if problems else parse_remote(value)

    def split(self, value) -> SplitSpec | None:
        keys = ("split",)
        if self.mapping(value, keys) is None:
            return None
        self.unknown_keys(value, keys, ("cuts", "balance"))
        if ("cuts" in value) == ("balance" in value):
            self.fail(keys, "give exactly one of 'cuts: [...]' or 'balance: N'")
            return None
        if "balance" in value:
            n = value["balance"]
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                self.fail(keys + ("balance",), f"must be a positive integer (number of cuts), got {n!r}")
                return None
            return SplitSpec(balance=n)
        cuts = value["cuts"]
        if not isinstance(cuts, list) or not cuts or not all(isinstance(c, str) and c.strip() for c in cuts):
            self.fail(keys + ("cuts",), f"must be a non-empty list of names, scopes or patterns, got {cuts!r}")
            return None
        return SplitSpec(cuts=tuple(cuts))
