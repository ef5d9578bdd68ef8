"""The command that installs an optional extra of tvm_probe (``torch``, ``hf``, ``tflite``,
``view``), written for where this tvm_probe was installed from.

tvm_probe is not on PyPI: a clone is installed with ``pip install -e <checkout>``, and there the
extra is ``pip install -e "<checkout>[view]"``.  The checkout is read from the editable install's
``direct_url.json`` (PEP 610), else it is the source tree the package runs from (a clone on
``PYTHONPATH``); anywhere else (a wheel) it is ``pip install "tvm_probe[view]"``, which pip
resolves from the installed distribution.  Every message that names a missing optional
dependency ends with :func:`install_hint`; messages are one line, and so is the hint.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import shlex
from pathlib import Path
from urllib.parse import unquote, urlparse

DISTRIBUTION = "tvm_probe"
#: The package folder; its parent is a checkout when it holds the packaging files.
_PACKAGE = Path(__file__).resolve().parents[1]


def install_hint(extra: str) -> str:
    """``pip install ...`` that adds ``extra`` to this tvm_probe, one line, quoted for a shell."""
    return pip_install(extra, checkout())


def pip_install(extra: str, checkout: str | os.PathLike | None) -> str:
    """The command for ``extra``: editable from ``checkout``, else by the distribution's name."""
    if checkout is None:
        return f'pip install "{DISTRIBUTION}[{extra}]"'
    return f"pip install -e {shell_word(f'{checkout}[{extra}]')}"


def checkout() -> Path | None:
    """The source checkout this tvm_probe comes from, or None (installed from a wheel)."""
    # Every distribution of the name, not only the first: run in the checkout, the path lists
    # its ``tvm_probe.egg-info`` (no direct_url.json) before site-packages.
    for dist in importlib.metadata.distributions(name=DISTRIBUTION):
        found = editable_checkout(dist.read_text("direct_url.json"))
        if found is not None:
            return found
    return _source_tree()


def editable_checkout(direct_url: str | None) -> Path | None:
    """The folder of an editable install, read from its ``direct_url.json`` text; None for any
    other install (from a wheel, an archive, a VCS URL) or no record at all."""
    try:
        record = json.loads(direct_url) if direct_url else None
    except json.JSONDecodeError:
        return None
    dir_info = record.get("dir_info") if isinstance(record, dict) else None
    if not isinstance(dir_info, dict) or dir_info.get("editable") is not True:
        return None
    url = urlparse(record.get("url", ""))
    return Path(_local_path(url.path)) if url.scheme == "file" else None


def _local_path(url_path: str) -> str:
    """A file URL's path as this system writes it (``/C:/x`` is ``C:\\x`` on Windows)."""
    # (urllib.request.url2pathname, but importing that module loads http and email)
    path = unquote(url_path)
    if os.name == "nt" and len(path) > 2 and path[0] == "/" and path[2] == ":":
        path = path[1:]
    return str(Path(path))


def _source_tree() -> Path | None:
    """The checkout the package runs from (setup.cfg and setup.py beside the package), else None."""
    root = _PACKAGE.parent
    return root if (root / "setup.cfg").is_file() and (root / "setup.py").is_file() else None


def shell_word(text: str) -> str:
    """``text`` as one shell word: in double quotes, which POSIX shells, cmd and PowerShell read
    alike, unless a POSIX shell would expand something inside them (then single quotes)."""
    if os.name == "nt" or not set(text) & set('"$`\\!'):
        return f'"{text}"'
    return shlex.quote(text)
