"""Putting a finished folder in place so that no reader ever sees half of it."""
from __future__ import annotations

import os
import shutil
from pathlib import Path


def replace_folder(finished: Path, target: Path) -> Path:
    """Rename ``finished`` (a sibling of ``target``) to ``target``.

    An existing ``target`` is moved aside first and removed only once the rename succeeded; if
    it fails, the old folder is put back, so ``target`` is always either old or new, whole.
    """
    if not target.exists():
        os.rename(finished, target)
        return target
    old = target.with_name(f".{target.name}.old-{os.getpid()}")
    os.rename(target, old)
    try:
        os.rename(finished, target)
    except OSError:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return target
