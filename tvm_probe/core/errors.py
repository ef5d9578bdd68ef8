"""The error types of tvm_probe.

Kept apart on purpose (the CLI's exit statuses follow them, see :class:`tvm_probe.core.schema.Exit`):

* :class:`ProbeError` and its subclasses are one-line errors about the user's material: a bad
  model file, bad inputs, an unknown name, a damaged dump.  Each names the problem and says what
  to do; the CLI prints it without a traceback and exits with status 2 —
* except :class:`TVMError`, a ProbeError too: TVM itself cannot import, compile or run the
  model.  The message carries TVM's own words and the source ops concerned; exit status 4.
* :class:`TVMBehaviourChanged` is *our* problem: TVM did something this version of tvm_probe
  does not understand (usually after a TVM upgrade).  It is not a ProbeError, so it is never
  mistaken for a user mistake (exit status 3).
* :class:`InternalError` is our problem too: tvm_probe's own code failed (a bug).  A TVMError
  carries only what TVM raised (:func:`raised_by_tvm`), never one of these (exit status 3).
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Iterable


@dataclass(frozen=True)
class Remedy:
    """What fixes a problem, in each set of words a user drives tvm_probe with: the Python
    argument, the YAML key of a config and the ``tvm-probe`` flag.  An error or a notice carries
    one; each front end says it in its own terms (:meth:`said`), so there is one message, not a
    table of messages per front end.

    Attributes:
        python: the whole phrase for Python, e.g. ``pass shapes={'x': (8, 2048)} to Probe.from_onnx``.
        key: the config key that fixes it (``model.shapes.x``), None where no key does.
        value: what to write under ``key`` (``[8, 2048]``).
        flag: the command-line flag that fixes it (``--shapes x=8x2048``), where a command takes one.
        cli: the whole phrase for the command line where key and flag do not say it (a dump folder).
    """

    python: str
    key: str | None = None
    value: str | None = None
    flag: str | None = None
    cli: str | None = None

    def said(self, terms: "Terms | None" = None) -> str:
        """The phrase in ``terms`` (Python's when None)."""
        if terms is None:
            return self.python
        options = []
        if self.flag is not None and self.flag.split("=")[0].split()[0] in terms.flags:
            options.append(f"give {self.flag}")
        if self.key is not None:
            options.append(f"set {self.key}: {self.value} {terms.where(self.key)}".rstrip())
        if not options:
            return self.cli or self.python
        return " or ".join(options)


@dataclass(frozen=True)
class Terms:
    """The command line's terms: the flags the command takes and the config it read (with the
    line of each key), so that a remedy names what the user can edit."""

    flags: frozenset = frozenset()
    config: str | None = None
    lines: dict = field(default_factory=dict)

    def where(self, key: str) -> str:
        """``in configs/x.yaml:7`` (the line of the key, else of its nearest parent); ``in a
        config`` when the run read none (``--write-config`` writes one)."""
        if self.config is None:
            return "in a config"
        parts = tuple(key.split("."))
        while parts and parts not in self.lines:
            parts = parts[:-1]
        return f"in {self.config}" + (f":{self.lines[parts]}" if parts else "")


class ProbeError(Exception):
    """Base class of every user-facing error; ``str(err)`` is one line.

    ``ProbeError(problem, remedy)``: the message is the problem and the remedy in Python's terms;
    :meth:`said` gives it in the command line's."""

    remedy: Remedy | None = None

    def __init__(self, *args, remedy: Remedy | None = None):
        self.remedy = remedy
        if remedy is not None and len(args) == 1:
            self.problem = str(args[0])
            args = (f"{self.problem}: {remedy.python}",)
        super().__init__(*args)

    def with_remedy(self, remedy: Remedy) -> "ProbeError":
        """This error, with ``remedy``: a fix known only above where it was raised."""
        self.problem, self.remedy = str(self), remedy
        self.args = (f"{self.problem}: {remedy.python}",)
        return self

    def said(self, terms: Terms | None = None) -> str:
        """The message in ``terms`` (:class:`Terms`; Python's when None)."""
        if self.remedy is None or terms is None:
            return str(self)
        return f"{self.problem}: {self.remedy.said(terms)}"


class ModelError(ProbeError):
    """The model file is missing, unreadable or not a model tvm_probe can import."""


class TVMError(ProbeError):
    """TVM cannot import, compile or run the model; the message names where, in source terms."""


class TVMImportError(ModelError, TVMError):
    """TVM's importer failed on a node of the model (its message and the node named)."""


class UnsupportedOpError(TVMImportError):
    """TVM's importer cannot convert a node of the model: it lacks the op (or this use of it)."""


class PipelineError(ProbeError):
    """The requested compilation pipeline or target is not usable."""


class TVMCompileError(PipelineError, TVMError):
    """The pipeline or the build failed on this model (TVM's message and the source ops named)."""


class TVMRunError(TVMError):
    """The compiled model failed while running."""


class KernelCrash(TVMRunError):
    """The process running the model died of a signal (a kernel read out of bounds: SIGSEGV),
    said by the process that watched it (:func:`tvm_probe.capture.watch.run_watched`).

    Attributes:
        kernel: the symbol of the kernel in flight (None: the process died outside any kernel).
        signal: the signal's name, e.g. ``"SIGSEGV"``.
        call: the kernel call (call-site index) in flight, or the last one that returned when
            ``kernel`` is None; None when no call is known.
        source_ops: the source ops that call computes, in words (``source op 'gather' (Gather)``;
            "" when none or not known).
        keys: their source keys.
        function: the VM function that ran (``"main"``).
    """

    def __init__(self, message: str = "", *, kernel: str | None = None, signal: str = "", call: int | None = None,
                 source_ops: str = "", keys: tuple = (), function: str = "main"):
        super().__init__(message)
        self.kernel, self.signal, self.call = kernel, signal, call
        self.source_ops, self.keys, self.function = source_ops, tuple(keys), function


class ConfigError(ProbeError):
    """A config (a YAML file, ``--set`` items, the flags that stand for its keys) is not valid;
    the message lists every problem with its line or flag."""


class InputError(ProbeError):
    """The inputs given to :meth:`Probe.run` do not match the model's inputs."""


class NameLookupError(ProbeError, KeyError):
    """A name does not resolve to exactly one source value."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class UnknownNameError(NameLookupError):
    """No source value has this name.

    ``what`` says which name; ``hint`` where to list the names (Python's by default; the CLI
    names its own command, :meth:`listed_by`)."""

    PYTHON_HINT = "list names with probe.sources"

    def __init__(self, what: str, hint: str | None = PYTHON_HINT, op_type: str | None = None):
        self.what, self.op_type = what, op_type
        if op_type is not None:  # what names an op type: say how to list by type (Python's words)
            hint = f"probe.find(op={op_type!r})"
        super().__init__(f"{what} ({hint})" if hint else what)

    def listed_by(self, hint: str) -> "UnknownNameError":
        """The same error, pointing to ``hint`` for the list of names (a CLI command; where the
        name is an op type, that command with ``--op``)."""
        if self.op_type is not None:
            return type(self)(self.what, f"{hint} --op {self.op_type}")
        return type(self)(self.what, hint)


class AmbiguousNameError(NameLookupError):
    """Several source values match this name."""


class NotRunError(ProbeError):
    """A value was asked for before :meth:`Probe.run`."""


class NotCapturedError(ProbeError):
    """A value was asked for that the run's ``capture=`` selection left out."""


class ValueUnavailableError(ProbeError):
    """The compiled module never computes this value (e.g. dead code)."""


class DumpError(ProbeError):
    """A dump folder cannot be written or read."""


class DumpExistsError(DumpError):
    """The target dump folder exists and overwriting was not asked for."""


class CorruptDumpError(DumpError):
    """A dump file is missing, truncated or was edited after it was written."""


class TVMBehaviourChanged(RuntimeError):
    """TVM behaved in a way this tvm_probe version does not understand (a bug, not a user error)."""


class InternalError(RuntimeError):
    """tvm_probe itself failed (a bug of ours, never reported as TVM's): not a ProbeError, so
    the CLI exits with the internal-error status; the message asks for a report."""


def raised_by_tvm(err: BaseException) -> bool:
    """Whether ``err`` came from TVM (through its FFI, which marks every error it raises in
    Python), rather than from Python code of tvm_probe's own."""
    return hasattr(err, "__tvm_ffi_error__") or type(err).__module__.split(".")[0] in ("tvm", "tvm_ffi")


def internal_error(err: BaseException, doing: str) -> InternalError:
    """The error for a failure of tvm_probe's own code while ``doing`` something."""
    return InternalError(f"tvm_probe failed {doing} ({type(err).__name__}: {one_line(err)}): this is a bug "
                         "in tvm_probe, not in TVM or the model; please report it with the model")


def closest(name: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The candidates most similar to ``name``, best first (for 'did you mean' hints): the same
    name in another case, then the names whose last components (as many as ``name`` has, on
    ``/`` boundaries) are closest to it — a typo in a suffix of a long scoped name — then the
    closest full names, then names ending with the same last component."""
    candidates = list(dict.fromkeys(candidates))
    wanted = name.strip("/").lower()
    depth = wanted.count("/") + 1
    by_suffix: dict[str, list[str]] = {}
    for candidate in candidates:
        by_suffix.setdefault("/".join(candidate.lower().split("/")[-depth:]), []).append(candidate)
    hits = list(by_suffix.get(wanted, ()))
    for suffix in difflib.get_close_matches(wanted, list(by_suffix), n=n, cutoff=0.75):
        hits += by_suffix[suffix]
    hits += difflib.get_close_matches(name, candidates, n=n, cutoff=0.5)
    tail = name.rsplit("/", 1)[-1]
    hits += [c for c in candidates if c.rsplit("/", 1)[-1] == tail]
    return [h for h in dict.fromkeys(hits) if h != name][:n]


#: Characters of another program's message (TVM's, onnxruntime's...) kept on a one-line error.
MESSAGE_LIMIT = 400


def _message_lines(text: object) -> list[str]:
    """The meaningful lines of a message: a traceback in it leaves only its last line."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    return lines[-1:] if lines and lines[0].startswith("Traceback") else lines


def _shortened(line: str, limit: int) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."


def one_line(text: object, limit: int = MESSAGE_LIMIT) -> str:
    """First meaningful line of ``text``, shortened: messages of other programs carry tracebacks."""
    lines = _message_lines(text)
    return _shortened(lines[0] if lines else "", limit)


# -- TVM's words ---------------------------------------------------------------------------------
_DEBUG_INFO = re.compile(r",?\s*!dbg !\d+")
_EMPTY_CLAUSE = re.compile(r": +:")  # TVM's "is false: : why" (not C++'s "::")


def tvm_message(err: BaseException) -> tuple[str, str]:
    """TVM's message as ``(one line, every line)``.

    The one line keeps every meaningful line of TVM's text: LLVM's verifier writes its verdict
    on the lines after "failed with the following errors:", which the first line alone drops.
    Debug annotations (``!dbg !169``) and empty clauses (``: :``) are removed.
    """
    lines = _message_lines(err)
    head = ""
    for line in lines:
        line = _DEBUG_INFO.sub("", line)
        head = line if not head else head + (" " if head.endswith(":") else "; ") + line
    return _shortened(_EMPTY_CLAUSE.sub(":", head), MESSAGE_LIMIT) or type(err).__name__, "\n".join(lines)


def failure_identity(error_type: str, message: str) -> str:
    """What makes two TVM failures the same one: the exception type and the message without its
    numbers (register, Var, temporary and line numbers, addresses differ between a whole module
    and a part of it).  The one rule for "the same failure" (passes, kernels, reduce)."""
    return error_type + ":" + " ".join(re.sub(r"0x[0-9a-fA-F]+|\d+", "#", message).split())


def same_failure_as(err: BaseException) -> str:
    """The :func:`failure_identity` of an exception TVM raised."""
    return failure_identity(type(err).__name__, tvm_message(err)[0])
