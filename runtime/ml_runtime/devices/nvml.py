"""NVIDIA's devices and driver from NVML (``pynvml``, package nvidia-ml-py), without CUDA or torch.

NVML answers in milliseconds what only the host knows: the driver's version, and per GPU its
name, compute capability, memory and UUID. :func:`read_nvml` asks it; :func:`visible_gpus` then
lists the GPUs as CUDA (and so torch) numbers them: ``CUDA_VISIBLE_DEVICES`` as CUDA reads it
(indices or ``GPU-`` UUID prefixes, in the order given; an invalid entry ends the list; empty
hides every GPU) over the GPUs in PCI bus order. Where NVML's view and CUDA's may differ, it says
why and the probe asks torch instead: a GPU in MIG mode (CUDA lists its instances), ``MIG-``
names, or GPUs of different models while ``CUDA_DEVICE_ORDER`` is not ``PCI_BUS_ID`` (CUDA then
orders them fastest first, by its own measure). NVML's memory total is the one nvidia-smi shows,
slightly above what CUDA reports as usable (H200: 143771 against 143155 MiB).

Example:
    >>> gpus = [NvmlGpu(0, "NVIDIA H100", 9, 0, 85_000_000_000, "GPU-aa11", "00000000:01:00.0"),
    ...         NvmlGpu(1, "NVIDIA H100", 9, 0, 85_000_000_000, "GPU-bb22", "00000000:02:00.0")]
    >>> [d.uuid for d in visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "1,0"})[0]]
    ['bb22', 'aa11']
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ml_runtime.devices.facts import DeviceFacts


@dataclass(frozen=True)
class NvmlGpu:
    """One GPU as NVML reports it (``index`` is NVML's).

    Example:
        >>> NvmlGpu(0, "NVIDIA H200", 9, 0, 150_754_820_096).mig
        False
    """

    index: int
    name: str
    major: int
    minor: int
    memory_total: int  # bytes
    uuid: str | None = None  # GPU-xxxxxxxx-...
    bus_id: str = ""
    mig: bool = False


@dataclass
class NvmlHost:
    """The driver and the GPUs.

    Example:
        >>> NvmlHost("580.159.04", 13000).cuda_driver
        '13.0'
    """

    driver_version: str
    cuda_driver_version: int | None = None  # e.g. 13000: the newest CUDA the driver runs
    gpus: list[NvmlGpu] = field(default_factory=list)

    @property
    def cuda_driver(self) -> str | None:
        """``13.0`` for 13000."""
        v = self.cuda_driver_version
        return None if not v else f"{v // 1000}.{(v % 1000) // 10}"


def load_pynvml() -> Any:
    """The ``pynvml`` module, or None when nvidia-ml-py is not installed.

    Example:
        >>> load_pynvml() is None or hasattr(load_pynvml(), "nvmlInit")
        True
    """
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported and friends: the value stays unknown
        return None


def _mig_enabled(nvml: Any, handle: Any) -> bool:
    modes = _optional(nvml.nvmlDeviceGetMigMode, handle)  # (current, pending); NotSupported off MIG GPUs
    return bool(modes and modes[0])


def read_nvml(nvml: Any) -> NvmlHost:
    """Ask NVML for the driver and every GPU; raises what NVML raises (no driver, no library).

    Example:
        >>> read_nvml(None)  # doctest: +SKIP
    """
    nvml.nvmlInit()
    try:
        host = NvmlHost(_text(nvml.nvmlSystemGetDriverVersion()),
                        _optional(nvml.nvmlSystemGetCudaDriverVersion))
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            pci = _optional(nvml.nvmlDeviceGetPciInfo, handle)
            uuid = _optional(nvml.nvmlDeviceGetUUID, handle)
            host.gpus.append(NvmlGpu(
                index=index,
                name=_text(nvml.nvmlDeviceGetName(handle)),
                major=int(major),
                minor=int(minor),
                memory_total=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                uuid=None if uuid is None else _text(uuid),
                bus_id=_text(pci.busId).lower() if pci is not None else f"{index:016d}",
                mig=_mig_enabled(nvml, handle),
            ))
        return host
    finally:
        nvml.nvmlShutdown()


def _entry(entry: str, ordered: Sequence[NvmlGpu]) -> NvmlGpu | None:
    # One CUDA_VISIBLE_DEVICES entry: an index into the ordered GPUs, or a unique GPU-UUID prefix.
    if entry.isdigit():
        return ordered[int(entry)] if int(entry) < len(ordered) else None
    if entry.lower().startswith("gpu-"):
        matches = [g for g in ordered if g.uuid and g.uuid.lower().startswith(entry.lower())]
        return matches[0] if len(matches) == 1 else None
    return None


def visible_gpus(
    gpus: Sequence[NvmlGpu], environ: Mapping[str, str]
) -> tuple[list[DeviceFacts] | None, str | None]:
    """(the GPUs CUDA will show, numbered as torch numbers them; None and why when only torch can tell).

    Example:
        >>> gpus = [NvmlGpu(0, "NVIDIA H200", 9, 0, 150_754_820_096, "GPU-85f7", "00000000:00:06.0")]
        >>> visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": ""})
        ([], None)
        >>> visible_gpus(gpus, {"CUDA_VISIBLE_DEVICES": "MIG-1b2c"})[1]
        'CUDA_VISIBLE_DEVICES names a MIG instance'
    """
    if any(g.mig for g in gpus):
        return None, "a GPU is in MIG mode (CUDA lists its instances, NVML the GPUs)"
    ordered = sorted(gpus, key=lambda g: g.bus_id)
    models = {(g.name, g.major, g.minor) for g in gpus}
    if len(models) > 1 and environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        return None, "GPUs of different models, and CUDA orders them fastest first (CUDA_DEVICE_ORDER unset)"
    value = environ.get("CUDA_VISIBLE_DEVICES")
    chosen: list[NvmlGpu] = list(ordered)
    if value is not None:
        chosen = []
        for raw in value.split(",") if value.strip() else []:
            if raw.strip().upper().startswith("MIG-"):
                return None, "CUDA_VISIBLE_DEVICES names a MIG instance"
            gpu = _entry(raw.strip(), ordered)
            if gpu is None:
                break  # CUDA: an invalid entry hides it and every entry after it
            if gpu in chosen:
                return None, f"CUDA_VISIBLE_DEVICES names a GPU twice ({value})"
            chosen.append(gpu)
    return [_device(i, g) for i, g in enumerate(chosen)], None


def _device(index: int, gpu: NvmlGpu) -> DeviceFacts:
    uuid = gpu.uuid
    if uuid and uuid.upper().startswith("GPU-"):
        uuid = uuid[4:]  # as torch prints it
    return DeviceFacts(index=index, name=gpu.name, total_memory=gpu.memory_total, major=gpu.major,
                       minor=gpu.minor, uuid=uuid)
