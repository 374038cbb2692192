"""Host facts that torch does not give: CPU, driver version, device nodes.

Driver version sources, tried in order (each one's failure is a note):

* NVIDIA: NVML through ``pynvml`` (package ``nvidia-ml-py``),
  ``/proc/driver/nvidia/version``, ``nvidia-smi --query-gpu=driver_version``.
* AMD: ``/sys/module/amdgpu/version`` (DKMS driver), ``amd-smi static``
  (``DRIVER: VERSION:``), ``rocm-smi --showdriverversion``.
* Intel: ``torch.xpu.get_device_properties(i).driver_version``, then
  ``xpu-smi discovery --dump 1,8``.

The parsers are pure functions of the tools' text so tests can feed recorded
output.

Example:
    >>> parse_nvidia_proc_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03  Tue Jun 6")
    '535.54.03'
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ml_runtime.devices.facts import TorchFacts
from ml_runtime.devices.tools import Runner, parse_csv_table, pick, run_tool

_PROC_NVIDIA = re.compile(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+(?:\.\d+)+)")
_VERSION_TOKEN = re.compile(r"\d+(?:\.\d+)+")


# Device nodes through which torch could see an accelerator: NVIDIA, AMD (KFD), Intel and other
# DRM render nodes, and WSL's GPU paravirtualisation. With none of them, torch sees no device.
ACCELERATOR_NODES = ("/dev/nvidiactl", "/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dri/renderD*", "/dev/dxg")

#: Where the host's /dev, /sys and /proc are read (default ``/``): a test's tree laid out as the
#: kernel lays them out, or the host's root mounted elsewhere.
HOST_ROOT_ENV = "RUNTIME_HOST_ROOT"


def host_root(environ: Mapping[str, str] | None = None) -> Path:
    """``$RUNTIME_HOST_ROOT``, else ``/``.

    Example:
        >>> host_root({"RUNTIME_HOST_ROOT": "/srv/host"}), host_root({})
        (PosixPath('/srv/host'), PosixPath('/'))
    """
    env = os.environ if environ is None else environ
    return Path(env.get(HOST_ROOT_ENV) or "/")


def host_path(path: str) -> Path:
    """An absolute host path (``/proc/...``) under :func:`host_root`.

    Example:
        >>> host_path("/proc/cpuinfo").name
        'cpuinfo'
    """
    return host_root() / path.lstrip("/")


def accelerator_nodes(environ: Mapping[str, str] | None = None) -> list[str]:
    """The accelerator device nodes present here (:data:`ACCELERATOR_NODES`, under :func:`host_root`), sorted.

    Example:
        >>> all(p.startswith("/dev/") for p in accelerator_nodes())
        True
    """
    prefix = str(host_root(environ)).rstrip("/")
    return sorted(p[len(prefix):] for pattern in ACCELERATOR_NODES for p in glob.glob(prefix + pattern))


@dataclass
class HostFacts:
    """CPU and driver information about the host.

    Example:
        >>> HostFacts(cpu_model="Xeon", cpu_cores=2).driver_version is None
        True
    """

    cpu_model: str | None = None
    cpu_cores: int | None = None  # usable by this process (cgroup/affinity aware)
    cpu_logical: int | None = None  # all logical CPUs of the machine
    driver_version: str | None = None
    driver_source: str | None = None
    device_nodes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def driver_vendor(vendor: str, facts: TorchFacts | None, nodes: list[str]) -> str:
    """Whose driver to read: the accelerator's, else that of torch's build when its device nodes exist
    (a driver too old for the build leaves torch without a device, and that is what to report).

    Example:
        >>> from ml_runtime.devices.facts import TorchFacts
        >>> driver_vendor("none", TorchFacts(torch_version="2.14.1", cuda_version="13.0"), ["/dev/nvidiactl"])
        'nvidia'
    """
    if vendor != "none" or facts is None:
        return vendor
    if facts.hip_version:
        return "amd" if "/dev/kfd" in nodes else "none"
    if facts.cuda_version and any(n.startswith("/dev/nvidia") for n in nodes):
        return "nvidia"
    return "none"


def gather_host_facts(
    vendor: str,
    facts: TorchFacts | None = None,
    runner: Runner = run_tool,
    driver: tuple[str, str] | None = None,
) -> HostFacts:
    """Collect :class:`HostFacts` for the detected ``vendor``; never raises.

    ``driver`` is a (version, source) already read (from NVML, with the devices).

    Example:
        >>> gather_host_facts("none").driver_version is None
        True
    """
    host = HostFacts(cpu_model=cpu_model(), cpu_cores=usable_cores(), cpu_logical=os.cpu_count())
    host.device_nodes = accelerator_nodes()
    if driver is not None:
        host.driver_version, host.driver_source = driver
        return host
    vendor = driver_vendor(vendor, facts, host.device_nodes)
    if vendor == "nvidia":
        _first_driver(
            host,
            [
                ("nvml", _nvml_driver),
                ("/proc/driver/nvidia/version", _proc_nvidia),
                ("nvidia-smi", lambda: _nvidia_smi_driver(runner)),
            ],
        )
    elif vendor == "amd":
        _first_driver(
            host,
            [
                ("/sys/module/amdgpu/version", _sys_amdgpu),
                ("amd-smi", lambda: _amd_smi_driver(runner)),
                ("rocm-smi", lambda: _rocm_smi_driver(runner)),
            ],
        )
    elif vendor == "intel":
        from_torch = next(
            (d.driver_version for d in (facts.devices if facts else []) if d.driver_version), None
        )
        _first_driver(
            host,
            [
                ("torch.xpu", lambda: (from_torch, None if from_torch else "not reported")),
                ("xpu-smi", lambda: _xpu_smi_driver(runner)),
            ],
        )
    return host


def _first_driver(host: HostFacts, sources: list) -> None:
    for name, source in sources:
        try:
            version, note = source()
        except Exception as exc:  # a broken binding must not break the probe
            version, note = None, f"{type(exc).__name__}: {exc}"
        if version:
            host.driver_version, host.driver_source = version, name
            return
        host.notes.append(f"driver version via {name}: {note or 'not found'}")


def cpu_model(cpuinfo: str | None = None) -> str | None:
    """CPU model name from ``/proc/cpuinfo`` (x86 ``model name``, others too).

    Example:
        >>> cpu_model("processor\\t: 0\\nmodel name\\t: AMD EPYC 9654 96-Core Processor\\n")
        'AMD EPYC 9654 96-Core Processor'
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    for key in ("model name", "cpu model", "hardware", "model", "cpu"):
        for line in cpuinfo.splitlines():
            name, _, value = line.partition(":")
            if name.strip().lower() == key and value.strip():
                return value.strip()
    return None


def usable_cores() -> int | None:
    """CPUs this process may run on (respects container cpusets).

    Example:
        >>> usable_cores() >= 1
        True
    """
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def parse_nvidia_proc_version(text: str) -> str | None:
    """Driver version from ``/proc/driver/nvidia/version``.

    Example:
        >>> parse_nvidia_proc_version("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15")
        '570.86.15'
    """
    match = _PROC_NVIDIA.search(text)
    return match.group(1) if match else None


def parse_amd_smi_driver(text: str) -> str | None:
    """Driver version from ``amd-smi static`` text (``DRIVER:`` block, ``VERSION:``).

    Example:
        >>> parse_amd_smi_driver("GPU: 0\\n    DRIVER:\\n        NAME: amdgpu\\n        VERSION: 6.8.5\\n")
        '6.8.5'
    """
    in_driver = False
    driver_indent = 0
    for line in text.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if stripped.upper() == "DRIVER:":
            in_driver, driver_indent = True, indent
            continue
        if in_driver:
            if indent <= driver_indent and stripped:
                in_driver = False
                continue
            key, _, value = stripped.partition(":")
            if key.strip().upper() == "VERSION" and value.strip() and value.strip().upper() != "N/A":
                return value.strip()
    return None


def parse_rocm_smi_driver(text: str) -> str | None:
    """Driver version from ``rocm-smi --showdriverversion`` (text or CSV).

    Example:
        >>> parse_rocm_smi_driver("Driver version: 6.8.5")
        '6.8.5'
        >>> parse_rocm_smi_driver("device,Driver version\\ncardsystem,6.8.5\\n")
        '6.8.5'
    """
    for line in text.splitlines():
        if "driver version:" in line.lower():
            match = _VERSION_TOKEN.search(line.lower().split("driver version:", 1)[1])
            if match:
                return match.group(0)
    for row in parse_csv_table(text):
        value = pick(row, "driver version")
        if value:
            return value
    return None


def parse_xpu_smi_driver(text: str) -> str | None:
    """Driver version from ``xpu-smi discovery --dump 1,8`` CSV.

    Example:
        >>> parse_xpu_smi_driver('Device ID,Driver Version\\n0,"I915_23.10.32_PSB_231129.32"\\n')
        'I915_23.10.32_PSB_231129.32'
    """
    for row in parse_csv_table(text):
        value = pick(row, "driver version")
        if value:
            return value
    return None


def _nvml_driver() -> tuple[str | None, str | None]:
    try:
        import pynvml
    except ImportError:
        return None, "pynvml not installed (pip install nvidia-ml-py)"
    pynvml.nvmlInit()
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
    finally:
        pynvml.nvmlShutdown()
    return (version.decode() if isinstance(version, bytes) else str(version)), None


def _proc_nvidia() -> tuple[str | None, str | None]:
    try:
        text = host_path("/proc/driver/nvidia/version").read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return None, exc.strerror
    return parse_nvidia_proc_version(text), None


def _nvidia_smi_driver(runner: Runner) -> tuple[str | None, str | None]:
    result = runner(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if not result.ok:
        return None, result.note
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    return (lines[0] if lines else None), None


def _sys_amdgpu() -> tuple[str | None, str | None]:
    try:
        return host_path("/sys/module/amdgpu/version").read_text(encoding="utf-8").strip() or None, None
    except OSError as exc:
        return None, exc.strerror


def _amd_smi_driver(runner: Runner) -> tuple[str | None, str | None]:
    result = runner(["amd-smi", "static"])
    return (parse_amd_smi_driver(result.stdout), None) if result.ok else (None, result.note)


def _rocm_smi_driver(runner: Runner) -> tuple[str | None, str | None]:
    result = runner(["rocm-smi", "--showdriverversion"])
    return (parse_rocm_smi_driver(result.stdout), None) if result.ok else (None, result.note)


def _xpu_smi_driver(runner: Runner) -> tuple[str | None, str | None]:
    result = runner(["xpu-smi", "discovery", "--dump", "1,8"])
    return (parse_xpu_smi_driver(result.stdout), None) if result.ok else (None, result.note)
