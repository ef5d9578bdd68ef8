"""Where a remote device is (``remote:`` in YAML, ``remote=`` in Python), checked without RPC.

The config imports this to validate ``remote:`` before anything connects; nothing here imports TVM.
"""
from __future__ import annotations

from dataclasses import dataclass


from ...core.errors import ProbeError, TVMRunError

KEYS = ("host", "port", "tracker", "key")
FORMS = "{host: HOST, port: PORT} or {tracker: 'HOST:PORT', key: KEY}"


class RemoteError(TVMRunError):
    """A remote device cannot be reached, lacks tvm_probe's instrument, or was lost in a run."""


# ------------------------------------------------------------------------------------- where
@dataclass(frozen=True)
class RemoteSpec:
    """Where a remote device is: a server (``host``, ``port``) or a tracker and a device key.

    Attributes:
        host, port: the RPC server (``tvm-probe serve --port``).
        tracker: ``(host, port)`` of a TVM RPC tracker; then ``key`` names the device kind.
        key: the server key (with a tracker: required; without one: the key the server was
            started with, usually empty).
    """

    host: str | None = None
    port: int | None = None
    tracker: tuple[str, int] | None = None
    key: str = ""

    def describe(self) -> str:
        """``host:port``, or ``key 'K' at tracker host:port``."""
        if self.tracker is not None:
            return f"key {self.key!r} at tracker {self.tracker[0]}:{self.tracker[1]}"
        return f"{self.host}:{self.port}"


def remote_problems(value) -> list[tuple[tuple, str]]:
    """What is wrong with a remote description (``(key path, message)`` each; empty when it is
    valid); :func:`parse_remote` and the YAML ``remote:`` key share this one check."""
    if not isinstance(value, dict):
        return [((), f"must be a mapping, {FORMS}, got {type(value).__name__}")]
    problems = [((k,), f"unknown key; valid keys here: {', '.join(KEYS)}") for k in value if k not in KEYS]
    if ("tracker" in value) == ("host" in value or "port" in value):
        problems.append(((), f"give {FORMS}"))
        return problems
    if "tracker" in value:
        if address(value["tracker"]) is None:
            problems.append((("tracker",), f"must be 'HOST:PORT', got {value['tracker']!r}"))
        if not isinstance(value.get("key"), str) or not value.get("key"):
            problems.append((("key",), f"must name the device key the servers registered with, got "
                                       f"{value.get('key')!r}"))
        return problems
    if not isinstance(value.get("host"), str) or not value.get("host"):
        problems.append((("host",), f"must be a host name or address, got {value.get('host')!r}"))
    port = value.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        problems.append((("port",), f"must be a port number (1-65535), got {port!r}"))
    if not isinstance(value.get("key", ""), str):
        problems.append((("key",), f"must be a string, got {value.get('key')!r}"))
    return problems


def parse_remote(value) -> RemoteSpec:
    """A :class:`RemoteSpec` from a dict (see :data:`FORMS`) or a RemoteSpec; ProbeError when
    it is not valid, with every problem."""
    if isinstance(value, RemoteSpec):
        return value
    problems = remote_problems(value)
    if problems:
        shown = "; ".join(f"{'.'.join(('remote',) + keys)}: {text}" for keys, text in problems)
        raise ProbeError(shown)
    if "tracker" in value:
        return RemoteSpec(tracker=address(value["tracker"]), key=value["key"])
    return RemoteSpec(host=value["host"], port=value["port"], key=value.get("key", ""))


def address(text) -> tuple[str, int] | None:
    """``(host, port)`` from ``'HOST:PORT'``; None when it is not one."""
    if not isinstance(text, str):
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)
