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
    >>> from ml_runtime.contract.spec_file import parse_spec
    >>> spec = parse_spec({"required_features": [{"gpu_compute_capability": "sm_80"}]}, "s.yaml")
    >>> result = run_checks(spec, build_probe(TorchFacts(torch_version="2.6.0+cpu")))
    >>> result[0].line("strict")
    '[CHECK] gpu_compute_capability: no accelerator (CPU only) -> FAIL (requires an NVIDIA GPU (sm_80)...)'
"""

from __future__ import annotations

from collections.abc import Sequence

from ml_runtime.contract.fields import version_at_least, version_tuple
from ml_runtime.contract.floors import check_host_driver
from ml_runtime.contract.packages import check_dependency, check_distribution, check_wheel
from ml_runtime.contract.result import CheckResult
from ml_runtime.contract.spec import DriverRequirement, Spec
from ml_runtime.devices import capability as cap
from ml_runtime.devices.probe import DeviceInfo, ProbeResult


def run_checks(
    spec: Spec,
    probe: ProbeResult,
    devices: Sequence[DeviceInfo] | None = None,
) -> list[CheckResult]:
    """Evaluate every item of ``spec``; ``devices`` defaults to all visible.

    Example:
        >>> from ml_runtime.devices.facts import TorchFacts
        >>> from ml_runtime.devices.probe import build_probe
        >>> from ml_runtime.contract.spec_file import parse_spec
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
        if dep.host_driver:
            results.append(check_host_driver(dep, probe))
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
    if version_at_least(version_tuple(probe.driver_version), version_tuple(minimum)):
        return CheckResult(item, found, True, need)
    return CheckResult(item, found, False, need, f"requires {need}", hint)
