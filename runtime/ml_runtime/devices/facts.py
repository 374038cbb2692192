"""Facts about torch and the accelerator, gathered in one place.

All vendor logic downstream (probe, checks, selection) works on a
:class:`TorchFacts` value rather than on torch itself, so tests can feed
recorded facts from NVIDIA, AMD and Intel machines and the real gathering can
still run on a CPU-only machine. :func:`gather_torch_facts` is the only code
here that touches torch, and it imports torch lazily.

PyTorch facts this relies on: ``torch.accelerator`` (2.6+) is the vendor-neutral
API; ROCm builds report through ``torch.cuda`` with device type ``"cuda"`` and
``torch.version.hip`` set (there is no ``torch.hip``); Intel GPUs use
``torch.xpu``.

Example:
    >>> facts = TorchFacts.from_dict({"torch_version": "2.5.1+cu124", "cuda_version": "12.4",
    ...     "accelerator_type": "cuda",
    ...     "devices": [{"index": 0, "name": "NVIDIA H100", "major": 9, "minor": 0}]})
    >>> facts.devices[0].major
    9
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

# Backends torch.distributed can report through is_<name>_available().
_DIST_BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")

# Prefix of the one stdout line the isolated child prints its facts on.
FACTS_MARKER = "ML_RUNTIME_FACTS "

# Before torch 2.8, Intel GPUs use the "ccl" backend from oneCCL's bindings.
CCL_BINDINGS = "oneccl_bindings_for_pytorch"


def metadata_torch_facts() -> TorchFacts:
    """torch's version from its package metadata, without importing it (milliseconds, not seconds).

    Enough for a contract that asks only for versions; devices and distributed are not read.

    Example:
        >>> metadata_torch_facts().devices
        []
    """
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return TorchFacts(torch_version=None, import_error="No module named 'torch'")
    return TorchFacts(torch_version=version, xpu_build=version.endswith("+xpu"))


@dataclass
class DeviceFacts:
    """Raw properties of one visible device, as torch reports them.

    Example:
        >>> DeviceFacts(index=0, name="AMD Instinct MI300X", gcn_arch_name="gfx942:sramecc+:xnack-").index
        0
    """

    index: int
    name: str
    total_memory: int | None = None  # bytes
    major: int | None = None  # NVIDIA compute capability (also set, but unused, on ROCm)
    minor: int | None = None
    gcn_arch_name: str | None = None  # AMD only
    device_id: int | None = None  # Intel PCI device id
    driver_version: str | None = None  # Intel reports it per device
    uuid: str | None = None
    bandwidth_gbps: float | None = None  # measured device-to-device copy, when asked for
    bandwidth_error: str | None = None


@dataclass
class TorchFacts:
    """Everything the probe needs to know about torch on this host.

    Example:
        >>> TorchFacts(torch_version=None, import_error="No module named 'torch'").devices
        []
    """

    torch_version: str | None
    import_error: str | None = None
    cuda_version: str | None = None  # torch.version.cuda
    hip_version: str | None = None  # torch.version.hip
    xpu_build: bool = False  # torch.version.xpu set or a +xpu wheel
    accelerator_api: bool = False  # torch.accelerator present (torch >= 2.6)
    accelerator_type: str | None = None  # "cuda", "xpu", ... or None without one
    cuda_available: bool = False
    xpu_available: bool = False
    devices: list[DeviceFacts] = field(default_factory=list)
    distributed_available: bool = False
    distributed_backends: dict[str, bool] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-ready), the format of the recorded fixtures.

        Example:
            >>> TorchFacts(torch_version="2.6.0+cpu").to_dict()["torch_version"]
            '2.6.0+cpu'
        """
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TorchFacts:
        """Rebuild facts from :meth:`to_dict` output; unknown keys are errors.

        Example:
            >>> TorchFacts.from_dict({"torch_version": "2.6.0"}).accelerator_type is None
            True
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown torch facts keys: {', '.join(unknown)}")
        values = dict(data)
        values["devices"] = [DeviceFacts(**d) for d in data.get("devices", [])]
        return cls(**values)


def ccl_bindings_installed() -> bool:
    """Whether oneCCL's bindings (the "ccl" backend of Intel GPUs before torch 2.8) are installed.

    Example:
        >>> isinstance(ccl_bindings_installed(), bool)
        True
    """
    return importlib.util.find_spec(CCL_BINDINGS) is not None


def gather_torch_facts(measure_bandwidth: bool = False) -> TorchFacts:
    """Collect :class:`TorchFacts` from the real torch; never raises.

    With ``measure_bandwidth`` every visible device also gets a measured
    device-to-device copy bandwidth (see :mod:`ml_runtime.devices.bandwidth`).

    Example:
        >>> facts = gather_torch_facts()
        >>> facts.torch_version is None or isinstance(facts.devices, list)
        True
    """
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install raising anything
        return TorchFacts(torch_version=None, import_error=f"{type(exc).__name__}: {exc}")

    facts = TorchFacts(torch_version=str(torch.__version__))
    version = getattr(torch, "version", None)
    facts.cuda_version = getattr(version, "cuda", None)
    facts.hip_version = getattr(version, "hip", None)
    facts.xpu_build = bool(getattr(version, "xpu", None)) or str(torch.__version__).endswith("+xpu")

    facts.cuda_available = _safe(facts, "torch.cuda.is_available", lambda: bool(torch.cuda.is_available()))
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and hasattr(xpu, "is_available"):
        facts.xpu_available = _safe(facts, "torch.xpu.is_available", lambda: bool(xpu.is_available()))

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "current_accelerator"):
        facts.accelerator_api = True
        facts.accelerator_type = _safe(facts, "torch.accelerator", lambda: _current_type(accelerator))
    elif facts.cuda_available:  # torch < 2.6: no vendor-neutral API yet
        facts.accelerator_type = "cuda"
    elif facts.xpu_available:
        facts.accelerator_type = "xpu"

    if facts.accelerator_type == "cuda":
        facts.devices = _safe(facts, "torch.cuda devices", lambda: _cuda_devices(torch), [])
    elif facts.accelerator_type == "xpu":
        facts.devices = _safe(facts, "torch.xpu devices", lambda: _xpu_devices(torch), [])

    _gather_distributed(facts)
    if measure_bandwidth:
        _measure_bandwidth(facts)
    return facts


def _measure_bandwidth(facts: TorchFacts) -> None:
    from ml_runtime.devices.bandwidth import measure_device_bandwidth

    for device in facts.devices:
        try:
            device.bandwidth_gbps = measure_device_bandwidth(
                facts.accelerator_type or "cuda", device.index, device.total_memory
            )
        except Exception as exc:  # e.g. out of memory on a busy device: report it, do not crash
            device.bandwidth_error = f"{type(exc).__name__}: {exc}"


def _safe(facts: TorchFacts, what: str, fn: Any, default: Any = None) -> Any:
    # A probe must never crash the entrypoint: record the failure as a note.
    try:
        return fn()
    except Exception as exc:
        facts.notes.append(f"{what} failed: {type(exc).__name__}: {exc}")
        return default


def _current_type(accelerator: Any) -> str | None:
    if hasattr(accelerator, "is_available") and not accelerator.is_available():
        return None
    device = accelerator.current_accelerator()  # None (or raises on some versions) without one
    return getattr(device, "type", None)


def _cuda_devices(torch: Any) -> list[DeviceFacts]:
    devices = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        uuid = getattr(props, "uuid", None)
        devices.append(
            DeviceFacts(
                index=index,
                name=str(props.name),
                total_memory=int(props.total_memory),
                major=int(props.major),
                minor=int(props.minor),
                gcn_arch_name=(getattr(props, "gcnArchName", None) or None)
                if getattr(torch.version, "hip", None)
                else None,
                uuid=str(uuid) if uuid is not None else None,
            )
        )
    return devices


def _xpu_devices(torch: Any) -> list[DeviceFacts]:
    devices = []
    for index in range(torch.xpu.device_count()):
        props = torch.xpu.get_device_properties(index)
        device_id = getattr(props, "device_id", None)
        uuid = getattr(props, "uuid", None)
        devices.append(
            DeviceFacts(
                index=index,
                name=str(props.name),
                total_memory=int(getattr(props, "total_memory", 0)) or None,
                device_id=int(device_id) if device_id is not None else None,
                driver_version=str(getattr(props, "driver_version", "") or "") or None,
                uuid=str(uuid) if uuid is not None else None,
            )
        )
    return devices


def _gather_distributed(facts: TorchFacts) -> None:
    try:
        import torch.distributed as dist

        facts.distributed_available = bool(dist.is_available())
    except Exception as exc:
        facts.notes.append(f"torch.distributed failed: {type(exc).__name__}: {exc}")
        return
    if not facts.distributed_available:
        return
    for name in _DIST_BACKENDS:
        check = getattr(dist, f"is_{name}_available", None)
        if check is not None:
            facts.distributed_backends[name] = bool(_safe(facts, f"is_{name}_available", check, False))
    facts.distributed_backends["ccl"] = ccl_bindings_installed()


def torch_install_key() -> str | None:
    """A digest of the installed torch's version and file list (its RECORD), None without torch.

    Example:
        >>> key = torch_install_key()
        >>> key is None or len(key) == 64
        True
    """
    try:
        dist = importlib.metadata.distribution("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    record = dist.read_text("RECORD") or ""
    return hashlib.sha256(f"{dist.version}\n{record}".encode()).hexdigest()


def build_facts(facts: TorchFacts) -> TorchFacts:
    """What torch's build decides, the host's part left out: no device, none available.

    Example:
        >>> f = build_facts(TorchFacts(torch_version="2.11.0+cu130", cuda_version="13.0", cuda_available=True,
        ...                            accelerator_type="cuda", devices=[DeviceFacts(0, "NVIDIA H200")]))
        >>> f.cuda_version, f.accelerator_type, f.devices
        ('13.0', None, [])
    """
    return TorchFacts.from_dict({**facts.to_dict(), "accelerator_type": None, "cuda_available": False,
                                 "xpu_available": False, "devices": []})


def record_torch_facts(path: Path) -> TorchFacts:
    """Gather the facts of torch's build (importing torch) and write them, keyed to this torch, to *path*.

    Run at image build, in the layer that installs torch (this file alone is mounted there, run as a
    script: a change elsewhere in the runtime does not rebuild it). Only what the build decides is
    kept: the devices, and whether one is available, are the host's at each start (a host that
    records its own torch, as ``make gpu-check`` does, records no GPU either). The JSON is
    byte-stable (sorted keys), so the layer holding it stays reproducible.

    Example:
        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp()) / "facts.json"
        >>> record_torch_facts(out).devices
        []
    """
    facts = build_facts(gather_torch_facts())
    document = {"torch_install": torch_install_key(), "facts": facts.to_dict()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, sort_keys=True, indent=1) + "\n", encoding="utf-8")
    return facts


def main(argv: list[str] | None = None) -> int:
    """``python -m ml_runtime.devices.facts [--bandwidth]``: print the facts as one marked JSON line.

    ``--record FILE`` writes them instead (:func:`record_torch_facts`, the image build), for
    :func:`~ml_runtime.devices.isolated.recorded_torch_facts`.

    Example:
        >>> main([])  # doctest: +ELLIPSIS
        ML_RUNTIME_FACTS {"torch_version": ...
        0
    """
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--record"] and len(args) == 2:
        facts = record_torch_facts(Path(args[1]))
        if facts.torch_version is None:
            print(f"torch facts not recorded: {facts.import_error}", file=sys.stderr)
            return 1
        return 0
    facts = gather_torch_facts(measure_bandwidth="--bandwidth" in args)
    print(FACTS_MARKER + json.dumps(facts.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
