"""Evaluating a :class:`~ml_runtime.contract.spec.Spec` against a probe.

Every GPU feature must hold on every device the command will see (all visible
devices, or the ones chosen by accelerator-config.yaml); the report names the
first device that fails. Without an accelerator, GPU features fail with a
message saying so. Items are reported in the spec's order, features first.

Report lines::

    [CHECK] <item>: <found> -> OK
    [CHECK] <item>: <found> -> FAIL (<why / what is required>)
    [CHECK] <item>: <found> -> WARN (<why / what is required>)   # warn mode

Example:
    >>> from ml_runtime.devices.facts import TorchFacts
    >>> from ml_runtime.devices.probe import build_probe
    >>> from ml_runtime.contract.spec import parse_spec
    >>> spec = parse_spec({"required_features": [{"gpu_compute_capability": "sm_80"}]}, "s.yaml")
    >>> result = run_checks(spec, build_probe(TorchFacts(torch_version="2.6.0+cpu")))
    >>> result[0].line("strict")
    '[CHECK] gpu_compute_capability: no accelerator (CPU only) -> FAIL (requires an NVIDIA GPU (sm_80)...)'
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from ml_runtime.contract.spec import Dependency, DriverRequirement, Spec
from ml_runtime.devices import capability as cap
from ml_runtime.devices.probe import DeviceInfo, ProbeResult

_TOKENS = re.compile(r"\d+")


@dataclass
class CheckResult:
    """Outcome of one contract item.

    Example:
        >>> CheckResult("pytorch", "2.1.2+cu121", True, ">=2.1.0,<2.2.0").line("strict")
        '[CHECK] pytorch: 2.1.2+cu121 -> OK'
    """

    item: str
    found: str
    ok: bool
    required: str
    reason: str | None = None  # why it failed (shown in parentheses)
    suggestion: str | None = None  # what would satisfy it

    def status(self, mode: str) -> str:
        """``OK``, ``FAIL`` (strict) or ``WARN`` (warn/off)."""
        if self.ok:
            return "OK"
        return "FAIL" if mode == "strict" else "WARN"

    def line(self, mode: str) -> str:
        """One report line."""
        status = self.status(mode)
        tail = "" if self.ok else f" ({self.reason or self.required})"
        return f"[CHECK] {self.item}: {self.found} -> {status}{tail}"

    def to_dict(self, mode: str) -> dict[str, Any]:
        """JSON object for ``--json``."""
        return {
            "item": self.item,
            "found": self.found,
            "required": self.required,
            "status": self.status(mode),
            "ok": self.ok,
            "reason": self.reason,
            "suggestion": self.suggestion,
        }


def run_checks(
    spec: Spec,
    probe: ProbeResult,
    devices: Sequence[DeviceInfo] | None = None,
) -> list[CheckResult]:
    """Evaluate every item of ``spec``; ``devices`` defaults to all visible.

    Example:
        >>> from ml_runtime.devices.facts import TorchFacts
        >>> from ml_runtime.devices.probe import build_probe
        >>> from ml_runtime.contract.spec import parse_spec
        >>> spec = parse_spec({"dependencies": [{"name": "pytorch", "version_range": ">=2.0"}]}, "s")
        >>> run_checks(spec, build_probe(TorchFacts(torch_version="2.13.0+cpu")))[0].ok
        True
    """
    devs = list(probe.devices if devices is None else devices)
    results = []
    for key, value in spec.features.items():
        if key == "gpu_compute_capability":
            results.append(check_capability(value, probe, devs))
        elif key == "memory_bandwidth_gbps":
            results.append(check_bandwidth(value, probe, devs))
        elif key == "driver_version_min":
            results.append(check_driver(value, probe, spec.required_vendor))
        elif key == "device_memory_gb":
            results.append(check_memory(value, probe, devs))
    for dep in spec.dependencies:
        results.append(check_dependency(dep, probe))
        if dep.full_distribution:
            results.append(check_distribution(dep, probe))
        if dep.vendor_agnostic_wheel:
            results.append(check_wheel(dep, probe))
    return results


def _no_accelerator(item: str, probe: ProbeResult, need: str, suggestion: str) -> CheckResult | None:
    # GPU-only features fail on CPU hosts; say why there is no accelerator.
    if probe.devices:
        return None
    found = (
        "no accelerator (CPU only)"
        if probe.vendor == "none"
        else f"{cap.VENDOR_LABEL[probe.vendor]} without devices"
    )
    why = "torch is not importable" if probe.torch.get("version") is None else "no accelerator was found"
    return CheckResult(item, found, False, need, f"requires {need} but {why}", suggestion)


def _describe_devices(devices: Sequence[DeviceInfo]) -> str:
    texts = []
    for d in devices:
        label = cap.VENDOR_LABEL[d.vendor]
        name = d.name if d.name.lower().startswith(label.lower()) else f"{label} {d.name}"
        texts.append(f"{name} ({d.capability.text if d.capability else 'unknown'})")
    if len(set(texts)) == 1:
        return texts[0] + (f" x{len(texts)}" if len(texts) > 1 else "")
    return ", ".join(f"[{d.index}] {t}" for d, t in zip(devices, texts))


def check_capability(
    required: cap.Capability, probe: ProbeResult, devices: Sequence[DeviceInfo]
) -> CheckResult:
    """``gpu_compute_capability``: every device, same vendor, new enough.

    Example:
        >>> from ml_runtime.devices.probe import ProbeResult, DeviceInfo
        >>> amd = DeviceInfo(0, "AMD Instinct MI250X", "amd", cap.amd_capability("gfx90a"))
        >>> p = ProbeResult(vendor="amd", backend="rocm", devices=[amd])
        >>> check_capability(cap.parse_capability("sm_80"), p, p.devices).reason
        'requires an NVIDIA GPU (sm_80) but found AMD gfx90a'
    """
    item = "gpu_compute_capability"
    need = f"an {cap.VENDOR_LABEL[required.vendor]} GPU ({required.text})"
    hint = cap.suggestion(required)
    missing = _no_accelerator(item, probe, need, hint)
    if missing:
        return missing
    found = _describe_devices(devices)
    for d in devices:
        if d.capability is None:
            return CheckResult(
                item,
                found,
                False,
                required.text,
                f"could not determine the architecture of device {d.index} ({d.name})",
                hint,
            )
        ok, why = cap.satisfies(d.capability, required)
        if not ok:
            prefix = (
                f"device {d.index} ({d.name}): " if len(devices) > 1 and d.vendor == required.vendor else ""
            )
            return CheckResult(item, found, False, required.text, prefix + why, hint)
    return CheckResult(item, found, True, required.text)


def check_memory(required_gb: float, probe: ProbeResult, devices: Sequence[DeviceInfo]) -> CheckResult:
    """``device_memory_gb``: the smallest device has at least this many GB.

    Example:
        >>> from ml_runtime.devices.probe import ProbeResult, DeviceInfo
        >>> d = DeviceInfo(0, "NVIDIA A100-SXM4-40GB", "nvidia", cap.nvidia_capability(8, 0), 42_505_273_344)
        >>> check_memory(40, ProbeResult("nvidia", "cuda", devices=[d]), [d]).line("strict")
        '[CHECK] device_memory_gb: 42.5 GB -> OK'
    """
    item, need = "device_memory_gb", f">= {required_gb:g} GB of device memory"
    hint = f"run on a device with >= {required_gb:g} GB of memory"
    missing = _no_accelerator(item, probe, need, hint)
    if missing:
        return missing
    known = [d for d in devices if d.memory_gb is not None]
    if not known:
        return CheckResult(item, "unknown", False, need, "device memory could not be determined", hint)
    smallest = min(known, key=lambda d: d.memory_gb or 0.0)
    found = f"{smallest.memory_gb:.1f} GB" + (
        f" (smallest of {len(devices)} devices)" if len(devices) > 1 else ""
    )
    if (smallest.memory_gb or 0.0) >= required_gb:
        return CheckResult(item, found, True, need)
    prefix = (
        f"device {smallest.index} ({smallest.name}) has {smallest.memory_gb:.1f} GB; "
        if len(devices) > 1
        else ""
    )
    return CheckResult(item, found, False, need, f"{prefix}requires {need}", hint)


def check_bandwidth(required: float | str, probe: ProbeResult, devices: Sequence[DeviceInfo]) -> CheckResult:
    """``memory_bandwidth_gbps``: the measured copy bandwidth of every device; "auto" only reports.

    The figures come from the probe (``probe_host(measure_bandwidth=True)``).

    Example:
        >>> from ml_runtime.devices.probe import ProbeResult, DeviceInfo
        >>> d = DeviceInfo(0, "NVIDIA H100", "nvidia", cap.nvidia_capability(9, 0), bandwidth_gbps=2900.4)
        >>> check_bandwidth(2000.0, ProbeResult("nvidia", "cuda", devices=[d]), [d]).found
        '2900 GB/s (measured)'
    """
    item = "memory_bandwidth_gbps"
    need = "a measurable device" if required == "auto" else f">= {required:g} GB/s"
    hint = (
        "run on an accelerator host"
        if required == "auto"
        else f"run on a device with >= {required:g} GB/s of memory bandwidth"
    )
    missing = _no_accelerator(item, probe, f"{need} (device-to-device copy)", hint)
    if missing:
        return missing
    for d in devices:
        if d.bandwidth_gbps is None:
            why = d.bandwidth_error or "no measurement was taken"
            return CheckResult(
                item, "measurement failed", False, need, f"measuring device {d.index} failed: {why}", hint
            )
    slowest = min(devices, key=lambda d: d.bandwidth_gbps or 0.0)
    value = slowest.bandwidth_gbps or 0.0
    found = f"{value:.0f} GB/s (measured" + (
        f", slowest of {len(devices)} devices)" if len(devices) > 1 else ")"
    )
    if required == "auto" or value >= float(required):
        return CheckResult(item, found, True, need)
    prefix = f"device {slowest.index} ({slowest.name}): " if len(devices) > 1 else ""
    return CheckResult(item, found, False, need, f"{prefix}requires {need}", hint)


def version_tuple(text: str) -> tuple[int, ...]:
    """Numeric tuple of a dotted driver version (suffixes after + or - ignored).

    Example:
        >>> version_tuple("535.54.03"), version_tuple("1.6.31294+21")
        ((535, 54, 3), (1, 6, 31294))
    """
    head = re.split(r"[+\-\s]", text.strip(), maxsplit=1)[0]
    return tuple(int(t) for t in _TOKENS.findall(head))


def _pad(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)), b + (0,) * (width - len(b))


def check_driver(required: DriverRequirement, probe: ProbeResult, spec_vendor: str | None) -> CheckResult:
    """``driver_version_min``: numeric dotted comparison on the host vendor's driver.

    An unqualified minimum belongs to the vendor named by
    ``gpu_compute_capability`` when the spec has one, else to whatever vendor
    the host has; the mapping form gives one minimum per vendor.

    Example:
        >>> from ml_runtime.devices.probe import ProbeResult, DeviceInfo
        >>> d = DeviceInfo(0, "NVIDIA H200", "nvidia", cap.nvidia_capability(9, 0))
        >>> p = ProbeResult("nvidia", "cuda", devices=[d], driver_version="570.86.15", driver_source="nvml")
        >>> check_driver(DriverRequirement({None: "535.54.03"}), p, "nvidia").line("strict")
        '[CHECK] driver_version_min: 570.86.15 (nvml) -> OK'
    """
    item = "driver_version_min"
    unqualified = required.minimums.get(None)
    if unqualified is not None:
        label = cap.VENDOR_LABEL[spec_vendor] + " driver" if spec_vendor else "driver"
        need = f"{label} >= {unqualified}"
    else:
        need = " or ".join(f"{cap.VENDOR_LABEL[v]} driver >= {m}" for v, m in required.minimums.items() if v)
    missing = _no_accelerator(item, probe, f"an accelerator with {need}", "run on an accelerator host")
    if missing:
        return missing
    vendor_label = cap.VENDOR_LABEL[probe.vendor]
    found = f"{probe.driver_version} ({probe.driver_source})" if probe.driver_version else "unknown"
    if unqualified is not None and spec_vendor and spec_vendor != probe.vendor:
        return CheckResult(
            item,
            f"{vendor_label} driver {found}",
            False,
            need,
            f"requires an {need} but the accelerator is {vendor_label}",
            f"run on a host with an {cap.VENDOR_LABEL[spec_vendor]} GPU",
        )
    minimum = required.for_vendor(probe.vendor)
    if minimum is None:
        return CheckResult(item, f"{found}, no minimum given for {probe.vendor}", True, need)
    need = f"{vendor_label} driver >= {minimum}"
    hint = f"upgrade the host's {vendor_label} driver to >= {minimum}"
    if not probe.driver_version:
        extra = " (install nvidia-ml-py for NVML)" if probe.vendor == "nvidia" else ""
        return CheckResult(
            item,
            found,
            False,
            need,
            f"requires {need} but the driver version could not be determined{extra}",
            hint,
        )
    have, want = _pad(version_tuple(probe.driver_version), version_tuple(minimum))
    if have >= want:
        return CheckResult(item, found, True, need)
    return CheckResult(item, found, False, need, f"requires {need}", hint)


def installed_version(dep: Dependency, probe: ProbeResult) -> tuple[str | None, str | None]:
    """(version, problem) of a dependency; torch comes from the probe.

    Example:
        >>> installed_version(Dependency("packaging", None, False, "d"), None)[0] is not None
        True
    """
    if dep.is_torch:
        version = probe.torch.get("version")
        return (
            (version, None)
            if version
            else (None, probe.torch.get("import_error") or "torch is not importable")
        )
    try:
        return importlib.metadata.version(dep.name), None
    except importlib.metadata.PackageNotFoundError:
        return None, "not installed"


def check_dependency(dep: Dependency, probe: ProbeResult) -> CheckResult:
    """A dependency is installed and in range (local ``+cpu`` etc. ignored).

    Example:
        >>> from packaging.specifiers import SpecifierSet
        >>> from ml_runtime.devices.probe import ProbeResult
        >>> p = ProbeResult("none", "cpu", torch={"version": "2.13.0+cpu"})
        >>> dep = Dependency("pytorch", SpecifierSet(">=2.1.0,<2.2.0"), True, "d", ">=2.1.0,<2.2.0")
        >>> check_dependency(dep, p).line("strict")
        '[CHECK] pytorch: 2.13.0+cpu -> FAIL (requires pytorch >=2.1.0,<2.2.0)'
    """
    rng = dep.range_text or (str(dep.version_range) if dep.version_range is not None else "")
    need = f"{dep.name} {rng}".strip()
    hint = f"install {dep.name}{' ' + rng if rng else ''} in the image"
    version, problem = installed_version(dep, probe)
    if version is None:
        return CheckResult(dep.name, "not available", False, need, f"requires {need}: {problem}", hint)
    if dep.version_range is None:
        return CheckResult(dep.name, version, True, need)
    try:
        # Compare the public version: "2.1.2+cu121" is 2.1.2 for range purposes;
        # pre-releases (nightlies) are allowed to match.
        public = Version(Version(version).public)
    except InvalidVersion:
        return CheckResult(dep.name, version, False, need, f"cannot parse version {version!r}", hint)
    if dep.version_range.contains(public, prereleases=True):
        return CheckResult(dep.name, version, True, need)
    return CheckResult(dep.name, version, False, need, f"requires {need}", f"{hint} (found {version})")


def check_distribution(dep: Dependency, probe: ProbeResult) -> CheckResult:
    """``full_distribution``: torch.distributed plus this host's backend.

    Example:
        >>> from ml_runtime.devices.probe import ProbeResult
        >>> p = ProbeResult("none", "cpu", torch={"version": "2.13.0+cpu"}, distributed_available=True,
        ...                 distributed_backends={"gloo": True})
        >>> check_distribution(Dependency("pytorch", None, True, "d"), p).line("strict")
        '[CHECK] pytorch.full_distribution: torch.distributed (gloo) -> OK'
    """
    item = f"{dep.name}.full_distribution"
    backend = probe.distributed_backend
    need = f"torch.distributed with the {backend} backend"
    hint = f"install a torch build with torch.distributed and {backend}"
    if backend == "ccl":
        hint = "install oneccl_bindings_for_pytorch, or torch >= 2.8 for the built-in xccl backend"
    if not probe.torch.get("version"):
        return CheckResult(item, "torch not importable", False, need, f"requires {need}", hint)
    if not probe.distributed_available:
        return CheckResult(
            item,
            "torch.distributed unavailable",
            False,
            need,
            "requires torch.distributed but this torch build has it disabled",
            hint,
        )
    available = sorted(name for name, ok in probe.distributed_backends.items() if ok)
    found = f"torch.distributed ({', '.join(available) or 'no backends'})"
    if probe.distributed_backends.get(backend):
        return CheckResult(item, found, True, need)
    return CheckResult(item, found, False, need, f"requires the {backend} backend for {probe.backend}", hint)


#: Local labels of the official PyTorch indexes (PyPI's default CUDA build carries none in its
#: metadata but reports e.g. +cu130 in torch.__version__).
_OFFICIAL_LOCAL = re.compile(r"^(cpu|cu\d{2,3}|rocm\d+(\.\d+){1,2}|xpu)$")
#: Set in every image by the builder from wheel-mapping.json: the torch pin and its build flavour.
WHEEL_VARIABLES = ("ML_RUNTIME_TORCH", "ML_RUNTIME_FLAVOUR")


def check_wheel(dep: Dependency, probe: ProbeResult, environ: Mapping[str, str] | None = None) -> CheckResult:
    """``vendor_agnostic_wheel``: torch is the official build the image's wheel mapping names.

    In an image built by ml-image-builder, ``ML_RUNTIME_TORCH`` and ``ML_RUNTIME_FLAVOUR``
    name the mapped torch and flavour (e.g. ``2.14.1`` and ``cuda 13.0``); torch must be that
    public version and flavour. Elsewhere torch must at least be an official index build
    (``+cpu``, ``+cuXYZ``, ``+rocmX.Y``, ``+xpu`` or none), not a vendor fork such as
    ``2.5.0a0+872d972e41.nv24.08``.

    Example:
        >>> from ml_runtime.devices.probe import ProbeResult
        >>> p = ProbeResult("none", "cpu", torch={"version": "2.13.0+cpu", "flavour": "cpu"})
        >>> check_wheel(Dependency("pytorch", None, False, "d"), p, {"ML_RUNTIME_TORCH": "2.13.0+cpu",
        ...             "ML_RUNTIME_FLAVOUR": "cpu"}).line("strict")
        '[CHECK] pytorch.vendor_agnostic_wheel: 2.13.0+cpu (cpu) -> OK'
    """
    env = os.environ if environ is None else environ
    item = f"{dep.name}.vendor_agnostic_wheel"
    version, flavour = probe.torch.get("version"), probe.torch.get("flavour")
    if not version:
        return CheckResult(item, "torch not importable", False, "an official torch wheel",
                           "requires torch", "install torch from the index the wheel mapping names")
    found = f"{version} ({flavour})"
    want_version, want_flavour = env.get("ML_RUNTIME_TORCH"), env.get("ML_RUNTIME_FLAVOUR")
    hint = "rebuild the image (builder build) so torch comes from the index wheel-mapping.json names"
    try:
        parsed = Version(version)
    except InvalidVersion:
        return CheckResult(item, found, False, "an official torch wheel", f"cannot parse {version!r}", hint)
    if want_version and want_flavour:
        need = f"torch {Version(want_version).public} ({want_flavour}) from the image's wheel mapping"
        ok = parsed.public == Version(want_version).public and flavour == want_flavour
        return CheckResult(item, found, ok, need, None if ok else f"requires {need}", None if ok else hint)
    need = "an official PyTorch index build (+cpu, +cuXYZ, +rocmX.Y, +xpu or PyPI's)"
    if parsed.local is None or _OFFICIAL_LOCAL.match(parsed.local):
        return CheckResult(item, found, True, need)
    return CheckResult(item, found, False, need, f"requires {need}; +{parsed.local} is a vendor build",
                       "install torch from the official index for this accelerator")


#: The design notes' names for the contract items (runtime-checker's report).
NOTES_TITLES = {
    "gpu_compute_capability": "GPU compute capability",
    "driver_version_min": "Driver version",
    "memory_bandwidth_gbps": "Memory bandwidth",
    "device_memory_gb": "Device memory",
}


def notes_title(item: str) -> str:
    """The notes' title of a contract item.

    Example:
        >>> notes_title("gpu_compute_capability"), notes_title("pytorch")
        ('GPU compute capability', 'PyTorch version')
        >>> notes_title("pytorch.full_distribution")
        'PyTorch distributed'
    """
    if item in NOTES_TITLES:
        return NOTES_TITLES[item]
    name, _, flag = item.partition(".")
    title = "PyTorch" if name.lower() in ("pytorch", "torch") else name
    return {"": f"{title} version", "full_distribution": f"{title} distributed",
            "vendor_agnostic_wheel": f"{title} wheel"}.get(flag, item)


def notes_lines(results: Sequence[CheckResult], mode: str) -> list[str]:
    """The design notes' report: ``[CHECK] ... -> OK (required: ...)`` or ``[ERROR] ... Suggestion: ...``.

    Example:
        >>> ok = CheckResult("pytorch", "2.13.0+cpu", True, "pytorch >=2.1")
        >>> bad = CheckResult("gpu_compute_capability", "none (CPU only)", False, "an NVIDIA GPU (sm_80)",
        ...                   "requires an NVIDIA GPU (sm_80)", "run on an NVIDIA GPU host")
        >>> print("\\n".join(notes_lines([ok, bad], "strict")))  # doctest: +NORMALIZE_WHITESPACE
        [CHECK] PyTorch version: 2.13.0+cpu -> OK (required: pytorch >=2.1)
        [ERROR] GPU compute capability mismatch: Required: an NVIDIA GPU (sm_80)
                Found: none (CPU only) Suggestion: run on an NVIDIA GPU host.
    """
    lines = []
    for r in results:
        title = notes_title(r.item)
        if r.ok:
            lines.append(f"[CHECK] {title}: {r.found} -> OK (required: {r.required})")
        elif mode == "strict":
            tip = (r.suggestion or r.reason or "see runtime-spec.yaml").rstrip(".")
            lines.append(
                f"[ERROR] {title} mismatch: Required: {r.required} Found: {r.found} Suggestion: {tip}."
            )
        else:
            lines.append(
                f"[WARN] {title} mismatch: Required: {r.required} Found: {r.found} (mode {mode}, continuing)"
            )
    return lines


def summary_line(results: Sequence[CheckResult], mode: str) -> str | None:
    """The one-line suggestion after failures (None when all passed).

    Example:
        >>> r = CheckResult("x", "y", False, "z", "why", "run on a GPU host")
        >>> summary_line([r], "strict")
        'runtime-check: 1 of 1 checks failed: run on a GPU host, or set RUNTIME_CHECK_MODE=warn'
    """
    failed = [r for r in results if not r.ok]
    if not failed:
        return None
    hints = list(dict.fromkeys(r.suggestion for r in failed if r.suggestion))
    # Drop a hint that a more specific one already contains ("... NVIDIA GPU" vs "... NVIDIA GPU of ...").
    hints = [h for h in hints if not any(o != h and o.startswith(h) for o in hints)]
    advice = "; ".join(hints) if hints else "see the lines above"
    if mode == "strict":
        return (
            f"runtime-check: {len(failed)} of {len(results)} checks failed: {advice}, "
            "or set RUNTIME_CHECK_MODE=warn"
        )
    return f"runtime-check: {len(failed)} of {len(results)} checks failed (mode {mode}, continuing): {advice}"
