"""The design notes' Python helpers: ``get_device()`` and ``get_gpu_metrics()``.

Both are re-exported by :mod:`ml_runtime`, so training code writes
``from ml_runtime import get_device, get_gpu_metrics``. They follow FACTS.md, not the notes'
mistakes: ROCm builds use the ``"cuda"`` device (there is no ``torch.hip`` and no ``"rocm"``
device), Intel GPUs ``"xpu"`` (native ``torch.xpu``, no intel-extension-for-pytorch).

Example:
    >>> str(get_device()) in ("cuda", "xpu", "cpu")  # cuda on an NVIDIA or AMD GPU, xpu on Intel's
    True
"""

from __future__ import annotations

from typing import Any

#: 1 MiB in MB (10**6 bytes): the notes' ``gpu_mem_used_mb`` is in MB, the tools report MiB.
MIB_IN_MB = 2**20 / 10**6


def device_type() -> str:
    """``cuda`` (NVIDIA and AMD ROCm), ``xpu`` (Intel) or ``cpu``, from the torch build and devices.

    Example:
        >>> import torch
        >>> device_type() == ("cuda" if torch.cuda.is_available() else device_type())
        True
    """
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and accelerator.is_available():
        current = accelerator.current_accelerator()
        if current is not None:
            return str(current.type)
    if torch.cuda.is_available():  # NVIDIA, and AMD through ROCm's torch.cuda
        return "cuda"
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return "xpu"
    return "cpu"


def get_device(index: int | None = None) -> Any:
    """The ``torch.device`` to train on: ``cuda`` on NVIDIA and AMD, ``xpu`` on Intel, else ``cpu``.

    ``index`` picks a device among the visible ones (after ``CUDA_VISIBLE_DEVICES``,
    ``HIP_VISIBLE_DEVICES`` or ``ZE_AFFINITY_MASK``); None means the current one.

    Example:
        >>> get_device().type == device_type()
        True
    """
    import torch

    kind = device_type()
    if kind == "cpu" or index is None:
        return torch.device(kind)
    return torch.device(kind, index)


def get_gpu_metrics(runner: Any = None, nvml: Any = "load") -> list[dict[str, Any]]:
    """One dict per GPU with the notes' field names; [] without GPUs or tools.

    Fields: ``index``, ``gpu_vendor`` (nvidia/amd/intel), ``gpu_model``, ``gpu_util_percent``,
    ``gpu_temp_c``, ``gpu_mem_used_mb`` and ``gpu_mem_total_mb`` (MB = 10**6 bytes), ``source``
    (nvml, amd-smi, rocm-smi, xpu-smi); a value the tool did not report is None. ``runner`` and
    ``nvml`` replace the tool runner and the pynvml module of
    :func:`ml_runtime.devices.metrics.collect_metrics` (tests; ``nvml=None``: no NVML).

    Example:
        >>> from ml_runtime.devices.tools import ToolResult
        >>> get_gpu_metrics(lambda argv: ToolResult(False, "", "not found"), nvml=None)  # no tool answers
        []
    """
    from ml_runtime.devices.metrics import collect_metrics
    from ml_runtime.devices.tools import run_tool

    report = collect_metrics(runner or run_tool, nvml)
    return [notes_fields(d) for d in report.devices]


def notes_fields(device: Any) -> dict[str, Any]:
    """One :class:`ml_runtime.devices.metrics.DeviceMetrics` under the notes' field names and units.

    Example:
        >>> from ml_runtime.devices.smi import DeviceMetrics
        >>> notes_fields(DeviceMetrics(0, "nvidia", "NVIDIA H200", 0.0, 39.0, 615.0625, 143771.0, "nvml"))
        ... # doctest: +NORMALIZE_WHITESPACE
        {'index': 0, 'gpu_vendor': 'nvidia', 'gpu_model': 'NVIDIA H200', 'gpu_util_percent': 0.0,
         'gpu_temp_c': 39.0, 'gpu_mem_used_mb': 644.9, 'gpu_mem_total_mb': 150754.8, 'source': 'nvml'}
    """

    def mb(mib: float | None) -> float | None:
        return None if mib is None else round(mib * MIB_IN_MB, 1)

    return {
        "index": device.index,
        "gpu_vendor": device.vendor,
        "gpu_model": device.model,
        "gpu_util_percent": device.utilization_pct,
        "gpu_temp_c": device.temperature_c,
        "gpu_mem_used_mb": mb(device.memory_used_mib),
        "gpu_mem_total_mb": mb(device.memory_total_mib),
        "source": device.source,
    }
