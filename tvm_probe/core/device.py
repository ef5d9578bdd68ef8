"""Devices: which TVM device a target's code runs on, what dumps call it, whether it is the host.

The one home of the target kind → device facts (a compiled module, a remote session, the
recomputer and the capture instrument all ask them).  TVM is imported lazily.
"""
from __future__ import annotations

#: Target kinds whose code runs on another device kind than their name says.
_DEVICE_OF_KIND = {"llvm": "cpu", "c": "cpu", "nvptx": "cuda"}

_DL_CPU = 1  # DLPack's kDLCPU
_RPC_SESS_MASK = 128  # tvm.rpc.base.RPC_SESS_MASK: added to the device type of a remote device


def device_kind(target) -> str:
    """The kind of device code built for ``target`` runs on: ``"cpu"``, ``"cuda"``, ``"rocm"``..."""
    kind = str(target.kind.name)
    return _DEVICE_OF_KIND.get(kind, kind)


def device_for(target):
    """The TVM device (index 0) that code built for ``target`` runs on."""
    import tvm

    return tvm.device(device_kind(target), 0)


def device_label(target) -> str:
    """How dumps and messages name that device: ``CPU``, ``CUDA``..."""
    return device_kind(target).upper()


def device_type(device) -> int:
    """DLPack device type of ``device``, without the mask a device of an RPC session carries."""
    return device.dlpack_device_type() % _RPC_SESS_MASK


def on_host(device) -> bool:
    """Whether ``device`` is a CPU (of this machine, or of a remote one)."""
    return device_type(device) == _DL_CPU
