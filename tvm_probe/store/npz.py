"""Arrays to ``.npz`` under any names (reproduction folders: inputs, expected values, constants)."""
from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Mapping

import numpy as np


def save_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """``np.savez`` for any tensor names (``np.savez`` takes them as keywords: no ``file``)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asarray(array), allow_pickle=False)
