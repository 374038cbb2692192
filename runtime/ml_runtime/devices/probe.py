"""Accelerator probe: vendor, backend, devices and distributed backend.

:func:`build_probe` is a pure function of :class:`~ml_runtime.devices.facts.TorchFacts`
and :class:`~ml_runtime.devices.host.HostFacts`; :func:`probe_host` gathers both for
real. Vendor rules: a ``"cuda"`` accelerator is AMD when ``torch.version.hip``
is set (ROCm builds reuse torch.cuda), NVIDIA otherwise; ``"xpu"`` is Intel.
Distributed backend: ``nccl`` for CUDA and ROCm (RCCL is exposed under the
nccl name), ``xccl`` for XPU from torch 2.8 (or when the build reports it),
``ccl`` before that, ``gloo`` on CPU.

Example:
    >>> from ml_runtime.devices.facts import TorchFacts
    >>> result = build_probe(TorchFacts(torch_version="2.6.0+cpu", distributed_available=True))
    >>> result.vendor, result.backend, result.distributed_backend
    ('none', 'cpu', 'gloo')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from packaging.version import InvalidVersion, Version

from ml_runtime.devices.capability import (
    VENDOR_LABEL,
    Capability,
    amd_capability,
    intel_capability,
    nvidia_capability,
)
from ml_runtime.devices.facts import DeviceFacts, TorchFacts
from ml_runtime.devices.gather import gather_facts
from ml_runtime.devices.host import HostFacts, gather_host_facts

BACKEND_OF_VENDOR = {"nvidia": "cuda", "amd": "rocm", "intel": "xpu", "none": "cpu"}
VENDOR_OF_BACKEND = {backend: vendor for vendor, backend in BACKEND_OF_VENDOR.items()}
# Variable that restricts which devices a child process sees, per vendor.
VISIBILITY_VARIABLE = {
    "nvidia": "CUDA_VISIBLE_DEVICES",
    "amd": "HIP_VISIBLE_DEVICES",
    "intel": "ZE_AFFINITY_MASK",
}


@dataclass
class DeviceInfo:
    """One visible device, vendor-normalised.

    Example:
        >>> d = DeviceInfo(0, "NVIDIA H100", "nvidia", nvidia_capability(9, 0), 85_000_000_000)
        >>> d.memory_gb
        85.0
    """

    index: int
    name: str
    vendor: str
    capability: Capability | None
    memory_total_bytes: int | None = None
    arch: str | None = None  # full gcnArchName on AMD, e.g. gfx942:sramecc+:xnack-
    device_id: int | None = None  # Intel PCI device id
    uuid: str | None = None
    bandwidth_gbps: float | None = None  # measured, when the spec asks for it
    bandwidth_error: str | None = None

    @property
    def memory_gb(self) -> float | None:
        """Total memory in GB (10**9 bytes, the unit of ``device_memory_gb``)."""
        return None if self.memory_total_bytes is None else self.memory_total_bytes / 1e9

    def label(self) -> str:
        """Short human label such as ``0 NVIDIA H100 (sm_90)``.

        Example:
            >>> DeviceInfo(1, "AMD Instinct MI250X", "amd", amd_capability("gfx90a")).label()
            '1 AMD Instinct MI250X (gfx90a)'
        """
        cap = f" ({self.capability.text})" if self.capability else ""
        return f"{self.index} {self.name}{cap}"

    def to_dict(self) -> dict[str, Any]:
        """JSON form of the device."""
        data: dict[str, Any] = {
            "index": self.index,
            "name": self.name,
            "vendor": self.vendor,
            "compute_capability": self.capability.text if self.capability else None,
            "memory_total_bytes": self.memory_total_bytes,
            "memory_total_mib": None if self.memory_total_bytes is None else self.memory_total_bytes // 2**20,
            "memory_total_gb": None if self.memory_gb is None else round(self.memory_gb, 2),
        }
        if self.vendor == "amd":
            data["gcn_arch_name"] = self.arch
        if self.vendor == "intel":
            data["device_id"] = None if self.device_id is None else f"0x{self.device_id:04x}"
            data["family"] = self.capability.family if self.capability else None
        if self.uuid:
            data["uuid"] = self.uuid
        if self.bandwidth_gbps is not None or self.bandwidth_error:
            data["bandwidth_gbps"] = None if self.bandwidth_gbps is None else round(self.bandwidth_gbps, 1)
            data["bandwidth_error"] = self.bandwidth_error
        return data


@dataclass
class ProbeResult:
    """What :func:`probe_host` reports.

    Example:
        >>> ProbeResult(vendor="none", backend="cpu").has_accelerator
        False
    """

    vendor: str
    backend: str
    torch: dict[str, Any] = field(default_factory=dict)
    devices: list[DeviceInfo] = field(default_factory=list)
    driver_version: str | None = None
    driver_source: str | None = None
    distributed_available: bool = False
    distributed_backend: str = "gloo"
    distributed_backends: dict[str, bool] = field(default_factory=dict)
    cpu: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    facts: TorchFacts | None = None
    source: str = "torch"  # where the facts came from (devices.gather): record, record+nvml, torch, ...
    torch_reason: str | None = None  # why torch was imported, and what it costs (None: it was not)

    @property
    def has_accelerator(self) -> bool:
        """True when a supported accelerator with at least one device is visible."""
        return self.vendor != "none" and bool(self.devices)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the ``probe --json`` output)."""
        return {
            "vendor": self.vendor,
            "backend": self.backend,
            "torch": self.torch,
            "devices": [d.to_dict() for d in self.devices],
            "driver": {"version": self.driver_version, "source": self.driver_source},
            "distributed": {
                "available": self.distributed_available,
                "backend": self.distributed_backend,
                "backends": self.distributed_backends,
            },
            "cpu": self.cpu,
            "notes": self.notes,
            "source": {"facts": self.source, "torch_imported": self.torch_reason},
        }


def classify(facts: TorchFacts) -> tuple[str, str]:
    """(vendor, backend) from torch facts.

    Example:
        >>> classify(TorchFacts(torch_version="2.5.1+rocm6.2", hip_version="6.2", accelerator_type="cuda"))
        ('amd', 'rocm')
    """
    kind = facts.accelerator_type
    if kind == "cuda":
        return ("amd", "rocm") if facts.hip_version else ("nvidia", "cuda")
    if kind == "xpu":
        return "intel", "xpu"
    return "none", "cpu"


def torch_build(facts: TorchFacts) -> dict[str, Any]:
    """Torch version and build flavour (cuda X.Y, rocm X.Y, xpu or cpu).

    Example:
        >>> torch_build(TorchFacts(torch_version="2.13.0+cpu"))["flavour"]
        'cpu'
        >>> torch_build(TorchFacts(torch_version="2.7.1+cu126", cuda_version="12.6"))["local"]
        'cu126'
    """
    version = facts.torch_version
    public, local = (version or ""), None
    if version and "+" in version:
        public, local = version.split("+", 1)
    if facts.hip_version:
        flavour = "rocm " + ".".join(facts.hip_version.split(".")[:2])
    elif facts.cuda_version:
        flavour = f"cuda {facts.cuda_version}"
    elif facts.xpu_build:
        flavour = "xpu"
    else:
        flavour = "cpu" if version else "unavailable"
    return {
        "version": version,
        "public_version": public or None,
        "local": local,
        "flavour": flavour,
        "cuda": facts.cuda_version,
        "hip": facts.hip_version,
        "xpu_available": facts.xpu_available,
        "accelerator_api": facts.accelerator_api,
        "import_error": facts.import_error,
    }


def choose_distributed_backend(backend: str, torch_version: str | None, available: dict[str, bool]) -> str:
    """The torch.distributed backend to use for ``backend``.

    Example:
        >>> choose_distributed_backend("rocm", "2.5.1", {})
        'nccl'
        >>> choose_distributed_backend("xpu", "2.7.0+xpu", {}), choose_distributed_backend("xpu", "2.8.0", {})
        ('ccl', 'xccl')
    """
    if backend in ("cuda", "rocm"):
        return "nccl"
    if backend == "xpu":
        return "xccl" if available.get("xccl") or _at_least(torch_version, "2.8") else "ccl"
    return "gloo"


def _at_least(version: str | None, minimum: str) -> bool:
    try:
        return Version(version or "0").release >= Version(minimum).release
    except InvalidVersion:
        return False


def device_info(vendor: str, device: DeviceFacts) -> DeviceInfo:
    """Vendor-normalise one device's raw facts.

    Example:
        >>> max1550 = DeviceFacts(0, "Intel(R) Data Center GPU Max 1550", device_id=0x0BD5)
        >>> device_info("intel", max1550).capability.family
        'pvc'
    """
    capability: Capability | None = None
    if vendor == "nvidia" and device.major is not None and device.minor is not None:
        capability = nvidia_capability(device.major, device.minor)
    elif vendor == "amd":
        capability = amd_capability(device.gcn_arch_name)
    elif vendor == "intel":
        capability = intel_capability(device.device_id, device.name)
    return DeviceInfo(
        index=device.index,
        name=device.name,
        vendor=vendor,
        capability=capability,
        memory_total_bytes=device.total_memory,
        arch=device.gcn_arch_name,
        device_id=capability.device_id if capability and vendor == "intel" else None,
        uuid=device.uuid,
        bandwidth_gbps=device.bandwidth_gbps,
        bandwidth_error=device.bandwidth_error,
    )


def build_probe(facts: TorchFacts, host: HostFacts | None = None) -> ProbeResult:
    """Combine torch and host facts into a :class:`ProbeResult`.

    Example:
        >>> from ml_runtime.devices.facts import DeviceFacts
        >>> f = TorchFacts(torch_version="2.6.0+xpu", xpu_build=True, accelerator_type="xpu",
        ...                devices=[DeviceFacts(0, "Intel(R) Data Center GPU Max 1550", device_id=0x0BD5)])
        >>> build_probe(f).devices[0].capability.text
        '0x0bd5'
    """
    host = host or HostFacts()
    vendor, backend = classify(facts)
    devices = [device_info(vendor, d) for d in facts.devices] if vendor != "none" else []
    result = ProbeResult(
        vendor=vendor,
        backend=backend,
        torch=torch_build(facts),
        devices=devices,
        driver_version=host.driver_version,
        driver_source=host.driver_source,
        distributed_available=facts.distributed_available,
        distributed_backend=choose_distributed_backend(
            backend, facts.torch_version, facts.distributed_backends
        ),
        distributed_backends=dict(facts.distributed_backends),
        cpu={"cores": host.cpu_cores, "logical": host.cpu_logical, "model": host.cpu_model},
        notes=[*facts.notes, *host.notes],
        facts=facts,
    )
    result.notes.extend(_mismatch_notes(facts, vendor, host))
    return result


def _mismatch_notes(facts: TorchFacts, vendor: str, host: HostFacts) -> list[str]:
    # Explain the common "why is it CPU?" situations in one line each.
    notes = []
    if facts.torch_version is None:
        notes.append(f"torch is not importable ({facts.import_error}); accelerators cannot be inspected")
        return notes
    if facts.accelerator_type not in (None, "cuda", "xpu"):
        notes.append(
            f"accelerator type {facts.accelerator_type!r} is not supported by this runtime; treated as CPU"
        )
    if vendor == "none":
        flavour = torch_build(facts)["flavour"]
        if flavour != "cpu":
            notes.append(
                f"torch is a {flavour} build but no device is visible (was the container given the GPU?)"
            )
        if "/dev/nvidiactl" in host.device_nodes and not facts.cuda_version:
            notes.append("an NVIDIA device node exists but torch has no CUDA support (CPU build?)")
        if "/dev/kfd" in host.device_nodes and not facts.hip_version:
            notes.append("an AMD /dev/kfd node exists but torch has no ROCm support")
    elif vendor != "none" and not facts.devices:
        notes.append(f"{VENDOR_LABEL[vendor]} accelerator reported but no device properties could be read")
    return notes


def probe_host(
    isolated: bool = False, measure_bandwidth: bool = False, versions_only: bool = False
) -> ProbeResult:
    """Probe this machine: torch's build from the image's record, the devices from the host, torch only
    when nothing else can tell (:mod:`ml_runtime.devices.gather` says when, and why).

    ``isolated`` asks torch, when it must, in a child process (used before ``exec``);
    ``measure_bandwidth`` adds a copy-bandwidth figure per device (torch); ``versions_only``: without
    a record, torch's version from its metadata is enough.

    Example:
        >>> probe_host().backend in ("cuda", "rocm", "xpu", "cpu")
        True
    """
    gathered = gather_facts(isolated, measure_bandwidth, versions_only)
    vendor, _ = classify(gathered.facts)
    result = build_probe(gathered.facts, gather_host_facts(vendor, gathered.facts, driver=gathered.driver))
    result.source, result.torch_reason = gathered.source, gathered.torch_reason
    return result


def format_probe(result: ProbeResult) -> str:
    """Text form of the probe (the ``probe`` output without ``--json``).

    Example:
        >>> result = ProbeResult(vendor="none", backend="cpu", cpu={"cores": 2, "model": "Xeon"})
        >>> print(format_probe(result).splitlines()[0])
        vendor: none
    """
    torch_info, cpu = result.torch, result.cpu
    lines = [
        f"vendor: {result.vendor}",
        f"backend: {result.backend}",
        f"torch: {torch_info.get('version') or 'not importable'} (build: {torch_info.get('flavour')}, "
        f"cuda: {torch_info.get('cuda') or '-'}, hip: {torch_info.get('hip') or '-'}, "
        f"xpu available: {'yes' if torch_info.get('xpu_available') else 'no'})",
        f"driver: {result.driver_version or 'unknown'}"
        + (f" ({result.driver_source})" if result.driver_source else ""),
        f"distributed backend: {result.distributed_backend} ({_backends_text(result)})",
        *(["devices:", *(_device_line(d) for d in result.devices)] if result.devices else ["devices: none"]),
        f"cpu: {cpu.get('cores') or '?'} usable cores of {cpu.get('logical') or '?'}, "
        f"{cpu.get('model') or 'unknown model'}",
        f"facts from: {result.source}" + (f" ({result.torch_reason})" if result.torch_reason else ""),
    ]
    lines.extend(f"note: {n}" for n in result.notes)
    return "\n".join(lines)


def _backends_text(result: ProbeResult) -> str:
    if not result.distributed_available:
        return "torch.distributed not available"
    names = [k for k, v in sorted(result.distributed_backends.items()) if v]
    return "available: " + (", ".join(names) or "none")


def _device_line(d: DeviceInfo) -> str:
    mem = "memory unknown"
    if d.memory_total_bytes:
        mem = f"{d.memory_total_bytes / 2**30:.1f} GiB ({d.memory_gb:.1f} GB)"
    arch = d.capability.text if d.capability else "unknown"
    if d.vendor == "amd" and d.arch:
        arch = d.arch  # the full gcnArchName, feature flags included
    elif d.vendor == "intel" and d.capability and d.capability.family:
        arch = f"{arch} ({d.capability.family})"
    return f"  [{d.index}] {d.name}  {arch}  {mem}"
