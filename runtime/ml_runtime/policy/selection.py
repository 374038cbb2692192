"""Choosing devices for an accelerator config, and the command's environment.

The rules a priority policy follows (which priority wins, what ``count`` does, what happens on
a host without an accelerator, which variables the command gets) are in runtime/README.md,
"What a priority policy promises".

Example:
    >>> from ml_runtime.devices.capability import nvidia_capability
    >>> from ml_runtime.devices.probe import DeviceInfo, ProbeResult
    >>> from ml_runtime.policy.config import parse_accelerator_config
    >>> devs = [DeviceInfo(0, "T4", "nvidia", nvidia_capability(7, 5), 16 * 10**9),
    ...         DeviceInfo(1, "A100", "nvidia", nvidia_capability(8, 0), 80 * 10**9)]
    >>> cfg = parse_accelerator_config({"criteria": [{"min_compute_capability": "sm_80"}]}, "a.yaml")
    >>> select_devices(cfg, ProbeResult("nvidia", "cuda", devices=devs), environ={}).env
    {'CUDA_VISIBLE_DEVICES': '1'}
    >>> policy = [{"priority": 1, "criteria": [{"type": "gpu_vendor", "equals": "amd"}]},
    ...           {"priority": 2, "criteria": [{"type": "memory_gb", "min": 40}]}]
    >>> cfg = parse_accelerator_config({"device_selection_policy": policy}, "a.yaml")
    >>> chosen = select_devices(cfg, ProbeResult("nvidia", "cuda", devices=devs), environ={})
    >>> chosen.priority, chosen.env
    (2, {'CUDA_VISIBLE_DEVICES': '1'})
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ml_runtime.contract.fields import version_at_least, version_tuple
from ml_runtime.devices.capability import VENDOR_LABEL, Capability, satisfies
from ml_runtime.devices.probe import VENDOR_OF_BACKEND, VISIBILITY_VARIABLE, DeviceInfo, ProbeResult
from ml_runtime.policy.config import AcceleratorConfig
from ml_runtime.policy.priorities import PolicyCriterion, PolicyEntry
from ml_runtime.policy.tuning import MIXED_PRECISION_VARIABLE, XNACK_VARIABLE


@dataclass
class Selection:
    """Result of :func:`select_devices`; ``problems`` are contract failures.

    ``priority`` is the ``device_selection_policy`` priority that chose the
    devices (None without a policy, or when none matched); ``warnings`` are
    full sentences to show as ``[WARN]`` lines (not part of :meth:`lines`).

    Example:
        >>> Selection(backend="cpu", vendor="none").ok
        True
    """

    backend: str
    vendor: str
    variable: str | None = None
    devices: list[DeviceInfo] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    priority: int | None = None
    priority_criteria: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the selection satisfied the config."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """JSON form (the ``select --json`` output)."""
        return {
            "backend": self.backend,
            "vendor": self.vendor,
            "variable": self.variable,
            "priority": self.priority,
            "priority_criteria": self.priority_criteria,
            "devices": [d.to_dict() for d in self.devices],
            "env": self.env,
            "ok": self.ok,
            "problems": self.problems,
            "warnings": self.warnings,
            "notes": self.notes,
        }

    def lines(self, mode: str = "strict") -> list[str]:
        """Text report lines.

        Example:
            >>> chosen = Selection("cuda", "nvidia", env={"CUDA_VISIBLE_DEVICES": "1"})
            >>> chosen.lines()[0]
            '[SELECT] backend cuda: devices none -> CUDA_VISIBLE_DEVICES=1'
            >>> Selection("rocm", "amd", priority=2, priority_criteria="gpu_vendor = amd").lines()[0]
            '[SELECT] priority 2 (gpu_vendor = amd): devices none -> environment unchanged'
        """
        chosen = ", ".join(d.label() for d in self.devices) or "none"
        env = " ".join(f"{k}={v}" for k, v in self.env.items()) or "environment unchanged"
        if self.priority is not None:
            head = f"priority {self.priority} ({self.priority_criteria or 'any device'})"
        else:
            head = f"backend {self.backend}"
        out = [f"[SELECT] {head}: devices {chosen} -> {env}"]
        status = "FAIL" if mode == "strict" else "WARN"
        out.extend(f"[SELECT] {status}: {p}" for p in self.problems)
        out.extend(f"[SELECT] note: {n}" for n in self.notes)
        return out


def _matches(device: DeviceInfo, key: str, value: Any) -> bool:
    if key == "vendor":
        return device.vendor == value
    if key == "min_compute_capability":
        return device.capability is not None and satisfies(device.capability, value)[0]
    if key == "min_memory_gb":
        return device.memory_gb is not None and device.memory_gb >= value
    return value.lower() in device.name.lower()


def _sort_key(device: DeviceInfo, criteria: tuple[tuple[str, Any], ...]) -> tuple:
    # Larger is better for capability and memory; negate for an ascending sort.
    key: list[Any] = []
    for name, _ in criteria:
        if name == "min_compute_capability" and device.capability is not None:
            key.append(tuple(-v for v in device.capability.version))
        elif name == "min_memory_gb":
            key.append(-(device.memory_total_bytes or 0))
    return (*key, device.index)


def _describe(criteria: tuple[tuple[str, Any], ...]) -> str:
    parts = []
    for name, value in criteria:
        parts.append(f"{name} {value.text if isinstance(value, Capability) else value}")
    return ", ".join(parts) or "no criteria"


def _policy_failure(device: DeviceInfo, criterion: PolicyCriterion, probe: ProbeResult) -> str | None:
    """Why ``device`` fails ``criterion`` (None when it holds)."""
    kind, value = criterion.type, criterion.value
    if kind == "gpu_compute_capability":
        if device.capability is None:
            return f"compute capability unknown (requires {value.text})"
        if criterion.op == "min":
            ok, reason = satisfies(device.capability, value)
            return None if ok else reason
        same = device.capability.vendor == value.vendor and (
            satisfies(device.capability, value)[0]
            if value.vendor == "intel"
            else device.capability.version == value.version
        )
        return (
            None if same else f"requires exactly {value.describe()} but found {device.capability.describe()}"
        )
    if kind == "driver_version":
        found = version_tuple(probe.driver_version)
        if not found:
            return f"requires driver >= {value} but the driver version is unknown"
        if version_at_least(found, version_tuple(value)):
            return None
        return f"requires driver >= {value} but found {probe.driver_version}"
    if kind == "gpu_vendor":
        if device.vendor == value:
            return None
        label = VENDOR_LABEL.get(device.vendor, device.vendor)
        return f"requires an {VENDOR_LABEL[value]} GPU but found {label}"
    if kind in ("memory_gb", "device_memory_gb"):
        if device.memory_gb is None:
            return f"requires >= {value:g} GB but the memory size is unknown"
        return (
            None
            if device.memory_gb >= value
            else f"requires >= {value:g} GB but found {device.memory_gb:.1f} GB"
        )
    return None if value.lower() in device.name.lower() else f"name does not contain {value!r}"


def _policy_sort_names(entry: PolicyEntry) -> tuple[tuple[str, Any], ...]:
    names = {"gpu_compute_capability": "min_compute_capability", "memory_gb": "min_memory_gb"}
    names["device_memory_gb"] = "min_memory_gb"
    return tuple((names[c.type], c.value) for c in entry.criteria if c.type in names)


def visible_tokens(variable: str, indices: list[int], environ: Mapping[str, str]) -> str:
    """Visibility value for ``indices``, mapped through an existing mask.

    Example:
        >>> visible_tokens("CUDA_VISIBLE_DEVICES", [1, 0], {"CUDA_VISIBLE_DEVICES": "2,3"})
        '3,2'
    """
    existing = [t.strip() for t in environ.get(variable, "").split(",") if t.strip()]
    return ",".join(existing[i] if i < len(existing) else str(i) for i in indices)


def select_devices(
    config: AcceleratorConfig, probe: ProbeResult, environ: Mapping[str, str] | None = None
) -> Selection:
    """Choose devices per ``config`` and compute the child's environment.

    Example:
        >>> from ml_runtime.policy.config import parse_accelerator_config
        >>> cfg = AcceleratorConfig("a.yaml", backend="cuda")
        >>> select_devices(cfg, ProbeResult("none", "cpu"), environ={}).problems
        ['backend cuda requested but this host has no NVIDIA accelerator (found: none, CPU only)']
        >>> cfg = parse_accelerator_config({"device_selection_policy": [
        ...     {"priority": 1, "criteria": [{"type": "gpu_vendor", "equals": "nvidia"}]}]}, "a.yaml")
        >>> cpu = select_devices(cfg, ProbeResult("none", "cpu"), environ={})
        >>> cpu.ok, cpu.backend, cpu.notes[0]
        (True, 'cpu', 'no device matched any priority; this host has no accelerator: running on CPU')
    """
    env = os.environ if environ is None else environ
    selection = _select(config, probe, env)
    _apply_config_env(config, selection, env)
    return selection


def _select(config: AcceleratorConfig, probe: ProbeResult, env: Mapping[str, str]) -> Selection:
    host_backend = probe.backend if probe.has_accelerator else "cpu"
    wanted = host_backend if config.backend == "auto" else config.backend
    selection = Selection(backend=wanted, vendor=VENDOR_OF_BACKEND[wanted])
    if wanted == "cpu":
        _select_cpu(config, probe, selection)
    elif wanted != host_backend:
        have = f"{VENDOR_LABEL[probe.vendor]} ({host_backend})" if probe.has_accelerator else "none, CPU only"
        selection.problems.append(
            f"backend {wanted} requested but this host has no {VENDOR_LABEL[VENDOR_OF_BACKEND[wanted]]} "
            f"accelerator (found: {have})"
        )
    else:
        _select_on_host(config, probe, selection, env)
    return selection


def _select_cpu(config: AcceleratorConfig, probe: ProbeResult, selection: Selection) -> None:
    """Backend cpu (asked for, or ``auto`` on a host without an accelerator): no devices; the host's
    accelerators, if any, hidden from the command where their variable can hide them."""
    if config.backend == "cpu":
        if config.policy:
            selection.notes.append(
                "backend cpu selects no devices; device_selection_policy and count are ignored"
            )
        elif config.criteria or config.count:
            selection.notes.append("backend cpu selects no devices; criteria and count are ignored")
    elif config.policy:  # auto on a host without an accelerator: nothing to rank
        selection.notes.append("no device matched any priority; this host has no accelerator: running on CPU")
    elif config.criteria or config.count:  # auto on a host without an accelerator
        selection.problems.append(
            f"criteria ({_describe(config.criteria)}) ask for devices but this host has no accelerator"
        )
    variable = VISIBILITY_VARIABLE.get(probe.vendor)
    if probe.has_accelerator and variable:
        if probe.vendor == "intel":
            selection.notes.append("Intel devices cannot be hidden with ZE_AFFINITY_MASK; they stay visible")
        else:
            selection.variable = variable
            selection.env[variable] = ""


def _select_on_host(config: AcceleratorConfig, probe: ProbeResult, selection: Selection,
                    env: Mapping[str, str]) -> None:
    """The host's backend: its devices by the policy or the criteria, ``count`` of them, and the
    visibility variable naming them."""
    if config.policy:
        candidates, describe = _select_by_policy(config, probe, selection)
        if not candidates:
            return
    else:
        candidates, describe = _select_by_criteria(config, probe, selection)
    wanted_count = config.count if config.count is not None else len(candidates)
    if candidates and len(candidates) < wanted_count:
        selection.problems.append(
            f"only {len(candidates)} of the requested {wanted_count} devices satisfy {describe}"
        )
    selection.devices = candidates[:wanted_count]
    variable = VISIBILITY_VARIABLE.get(probe.vendor)
    selection.variable = variable
    if variable and selection.devices:
        selection.env[variable] = visible_tokens(variable, [d.index for d in selection.devices], env)


def _select_by_criteria(
    config: AcceleratorConfig, probe: ProbeResult, selection: Selection
) -> tuple[list[DeviceInfo], str]:
    """Devices meeting every criterion, best first (a problem in ``selection`` when none does)."""
    candidates = [d for d in probe.devices if all(_matches(d, k, v) for k, v in config.criteria)]
    candidates.sort(key=lambda d: _sort_key(d, config.criteria))
    if not candidates:
        selection.problems.append(
            f"no device satisfies the criteria ({_describe(config.criteria)}) among "
            f"{', '.join(d.label() for d in probe.devices)}"
        )
    return candidates, f"the criteria ({_describe(config.criteria)})"


def _select_by_policy(
    config: AcceleratorConfig, probe: ProbeResult, selection: Selection
) -> tuple[list[DeviceInfo], str]:
    """Devices of the first priority that any device meets (records it in ``selection``)."""
    failures: list[str] = []
    driver_unknown = False
    for entry in config.policy:
        reasons: dict[str, list[str]] = {}
        qualifying = []
        for device in probe.devices:
            reason = next((r for r in (_policy_failure(device, c, probe) for c in entry.criteria) if r), None)
            if reason is None:
                qualifying.append(device)
            else:
                reasons.setdefault(reason, []).append(str(device.index))
                driver_unknown = driver_unknown or "driver version is unknown" in reason
        if qualifying:
            qualifying.sort(key=lambda d: _sort_key(d, _policy_sort_names(entry)))
            selection.priority = entry.priority
            selection.priority_criteria = entry.describe()
            selection.notes.extend(f"skipped {failure}" for failure in failures)
            _driver_note(selection, driver_unknown)
            return qualifying, f"priority {entry.priority} ({entry.describe()})"
        why = "; ".join(
            f"{'device' if len(idx) == 1 else 'devices'} {','.join(idx)}: {reason}"
            for reason, idx in reasons.items()
        )
        failures.append(f"priority {entry.priority} ({entry.describe()}): {why or 'no devices'}")
    _driver_note(selection, driver_unknown)
    found = ", ".join(d.label() for d in probe.devices)
    driver = f", driver {probe.driver_version}" if probe.driver_version else ", driver unknown"
    selection.problems.append(
        f"no device matches any priority of device_selection_policy: {' | '.join(failures)} "
        f"(found: {found}{driver})"
    )
    selection.variable = VISIBILITY_VARIABLE.get(probe.vendor)
    return [], ""


def _driver_note(selection: Selection, driver_unknown: bool) -> None:
    if driver_unknown:
        selection.notes.append(
            "the host driver version could not be determined, so no driver_version criterion holds"
        )


def _apply_config_env(config: AcceleratorConfig, selection: Selection, env: Mapping[str, str]) -> None:
    """Add ``config.env`` where it fits the selected backend; warnings into ``selection``."""
    selection.warnings.extend(config.warnings)
    for variable, value in config.env.items():
        if variable == XNACK_VARIABLE and selection.backend != "rocm":
            selection.warnings.append(
                f"rocm_config.use_unified_memory only applies to ROCm (it sets {XNACK_VARIABLE}=1); "
                f"the selected backend is {selection.backend}, so it has no effect."
            )
            continue
        if variable == MIXED_PRECISION_VARIABLE and value == "fp16" and selection.backend == "cpu":
            selection.warnings.append(
                f"amp_config.dtype float16 has no effect on CPU: Accelerate only autocasts to float16 on a "
                f"GPU, so {MIXED_PRECISION_VARIABLE} is not set and the command runs in float32 "
                "(bfloat16 is the mixed precision for CPU)."
            )
            continue
        current = env.get(variable)
        if current is not None and current != value:
            selection.warnings.append(
                f"{variable}={current} is already set in the environment and is kept; "
                f"the accelerator config asks for {variable}={value}."
            )
            continue
        selection.env[variable] = value
        if variable == XNACK_VARIABLE:
            _xnack_notes(selection)
        elif variable == MIXED_PRECISION_VARIABLE:
            selection.notes.append(
                f"{MIXED_PRECISION_VARIABLE}={value} (amp_config) applies to programs that create "
                "accelerate.Accelerator() without mixed_precision=; `accelerate launch` passes its own "
                "--mixed_precision (default no), and plain PyTorch code must use torch.autocast itself"
            )


def _xnack_notes(selection: Selection) -> None:
    unsupported = [
        d for d in selection.devices if d.vendor == "amd" and d.arch and "xnack" not in d.arch.lower()
    ]
    if unsupported:
        selection.warnings.append(
            f"{XNACK_VARIABLE}=1 has no effect on {', '.join(d.label() for d in unsupported)}: "
            "this GPU does not support XNACK (on-demand page migration for unified memory)."
        )
    selection.notes.append(
        f"{XNACK_VARIABLE}=1 (rocm_config.use_unified_memory) lets the GPU fault on and migrate "
        "unified/managed memory; it needs a kernel with HMM support, "
        "and PyTorch still allocates with hipMalloc"
    )
