"""Helpers the tests share: the models they build, real TVM bugs, fuzz graphs, and the data files
those read (``tflite_models/``, ``onnx_models/``).  Not part of tvm_probe.

Importable as ``support`` because pytest puts ``tests/`` on ``sys.path`` when it loads
``tests/conftest.py`` (the default ``prepend`` import mode, no ``__init__.py`` in ``tests/``); the
benchmarks in ``bench/`` put ``tests/`` there themselves.
"""
from pathlib import Path

SUPPORT = Path(__file__).parent  # the folder, for tests that hand a helper's file path to a config
