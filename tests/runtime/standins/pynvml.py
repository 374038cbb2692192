"""A stand-in for nvidia-ml-py's ``pynvml`` that answers from a recording of a real NVIDIA host.

We have no NVIDIA GPU here. This module answers the NVML calls the runtime makes (and only those;
any other is an AttributeError) with what NVML answered on a real H200 host:
``fixtures/recorded/h200-2026-12-04-nvml.json``, or the file named by ``$PYNVML_RECORDING`` (a test
that changes one answer, such as the driver's version, writes its own copy and says so). Subprocess
tests put this folder first on ``PYTHONPATH``; in-process tests put the module in ``sys.modules``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

DEFAULT = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "h200-2026-12-04-nvml.json"

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_MEM = 2


class NVMLError(Exception):
    """What nvidia-ml-py raises (its subclasses name the NVML return code)."""


class NVMLError_Uninitialized(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


_state: dict[str, Any] = {"data": None}


def _data() -> dict[str, Any]:
    if _state["data"] is None:
        raise NVMLError_Uninitialized("Uninitialized")
    data: dict[str, Any] = _state["data"]
    return data


def _gpu(handle: int) -> dict[str, Any]:
    gpu: dict[str, Any] = _data()["gpus"][handle]
    return gpu


def nvmlInit() -> None:
    _state["data"] = json.loads(Path(os.environ.get("PYNVML_RECORDING") or DEFAULT).read_text())


def nvmlShutdown() -> None:
    _data()
    _state["data"] = None


def nvmlSystemGetDriverVersion() -> str:
    return str(_data()["driver_version"])


def nvmlSystemGetCudaDriverVersion() -> int:
    return int(_data()["cuda_driver_version"])


def nvmlDeviceGetCount() -> int:
    return len(_data()["gpus"])


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    if not 0 <= index < nvmlDeviceGetCount():
        raise NVMLError("Invalid Argument")
    return index


def nvmlDeviceGetName(handle: int) -> str:
    return str(_gpu(handle)["name"])


def nvmlDeviceGetUUID(handle: int) -> str:
    return str(_gpu(handle)["uuid"])


def nvmlDeviceGetCudaComputeCapability(handle: int) -> tuple[int, int]:
    major, minor = _gpu(handle)["cuda_compute_capability"]
    return int(major), int(minor)


def nvmlDeviceGetPciInfo(handle: int) -> SimpleNamespace:
    return SimpleNamespace(busId=_gpu(handle)["pci_bus_id"])


def nvmlDeviceGetMigMode(handle: int) -> tuple[int, int]:
    current, pending = _gpu(handle)["mig_mode"]
    return int(current), int(pending)


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    gpu = _gpu(handle)
    return SimpleNamespace(total=gpu["memory_total"], used=gpu["memory_used"],
                           free=gpu["memory_total"] - gpu["memory_used"])


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:
    return SimpleNamespace(gpu=_gpu(handle)["utilization_gpu"], memory=None)


def nvmlDeviceGetTemperature(handle: int, sensor: int) -> int:
    if sensor != NVML_TEMPERATURE_GPU:
        raise NVMLError_NotSupported("Not Supported")
    return int(_gpu(handle)["temperature_gpu"])
