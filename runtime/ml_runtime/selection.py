"""Device selection from ``accelerator-config.yaml``.

Format::

    backend: auto            # auto | cuda | rocm | xpu | cpu
    criteria:                # ordered; devices must satisfy all,
      - min_compute_capability: "sm_80"   # then are sorted by the criteria in order
      - vendor: nvidia                    # nvidia | amd | intel
      - min_memory_gb: 40                 # GB = 10**9 bytes
      - name: "H100"                      # case-insensitive substring of the device name
    count: 2                 # how many to pick (default: all that match)

Sorting: ``min_compute_capability`` prefers newer architectures,
``min_memory_gb`` prefers more memory, ``vendor``/``name`` only filter; ties
keep the device order. The chosen devices, best first, reach the command only
through the vendor's visibility variable in the environment given to
``execvp`` (``CUDA_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES``,
``ZE_AFFINITY_MASK``); the checker's own environment is never changed. When
that variable is already set (by the orchestrator), the chosen indices are
mapped through it, since torch numbers only the devices it can see.
``backend: cpu`` hides NVIDIA and AMD devices with an empty variable (Intel
devices cannot be hidden through ZE_AFFINITY_MASK; a note says so).

Config file: ``--config``, else ``$ACCELERATOR_CONFIG``, else
``/workspace/accelerator-config.yaml`` when present.

Example:
    >>> from ml_runtime.probe import ProbeResult, DeviceInfo
    >>> from ml_runtime.capability import nvidia_capability
    >>> devs = [DeviceInfo(0, "T4", "nvidia", nvidia_capability(7, 5), 16 * 10**9),
    ...         DeviceInfo(1, "A100", "nvidia", nvidia_capability(8, 0), 80 * 10**9)]
    >>> cfg = parse_accelerator_config({"criteria": [{"min_compute_capability": "sm_80"}]}, "a.yaml")
    >>> select_devices(cfg, ProbeResult("nvidia", "cuda", devices=devs), environ={}).env
    {'CUDA_VISIBLE_DEVICES': '1'}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ml_runtime.capability import VENDOR_LABEL, Capability, satisfies
from ml_runtime.errors import ConfigError
from ml_runtime.probe import VENDOR_OF_BACKEND, VISIBILITY_VARIABLE, DeviceInfo, ProbeResult
from ml_runtime.spec import (
    capability_value,
    load_yaml_mapping,
    positive_number,
    type_name,
    unknown_key,
    workspace_dir,
)

CONFIG_FILENAME = "accelerator-config.yaml"
BACKENDS = ("auto", "cuda", "rocm", "xpu", "cpu")
CRITERIA_KEYS = ("min_compute_capability", "vendor", "min_memory_gb", "name")
CONFIG_KEYS = ("backend", "criteria", "count")
VENDORS = ("nvidia", "amd", "intel")


@dataclass(frozen=True)
class AcceleratorConfig:
    """A validated accelerator-config.yaml.

    Example:
        >>> AcceleratorConfig(source="a.yaml").backend
        'auto'
    """

    source: str
    backend: str = "auto"
    criteria: tuple[tuple[str, Any], ...] = ()
    count: int | None = None


@dataclass
class Selection:
    """Result of :func:`select_devices`; ``problems`` are contract failures.

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
            "devices": [d.to_dict() for d in self.devices],
            "env": self.env,
            "ok": self.ok,
            "problems": self.problems,
            "notes": self.notes,
        }

    def lines(self, mode: str = "strict") -> list[str]:
        """Text report lines.

        Example:
            >>> chosen = Selection("cuda", "nvidia", env={"CUDA_VISIBLE_DEVICES": "1"})
            >>> chosen.lines()[0]
            '[SELECT] backend cuda: devices none -> CUDA_VISIBLE_DEVICES=1'
        """
        chosen = ", ".join(d.label() for d in self.devices) or "none"
        env = " ".join(f"{k}={v}" for k, v in self.env.items()) or "environment unchanged"
        out = [f"[SELECT] backend {self.backend}: devices {chosen} -> {env}"]
        status = "FAIL" if mode == "strict" else "WARN"
        out.extend(f"[SELECT] {status}: {p}" for p in self.problems)
        out.extend(f"[SELECT] note: {n}" for n in self.notes)
        return out


def parse_accelerator_config(data: dict[str, Any], source: str) -> AcceleratorConfig:
    """Validate a loaded accelerator-config mapping.

    Example:
        >>> parse_accelerator_config({"count": 0}, "a.yaml")
        Traceback (most recent call last):
        ...
        ml_runtime.errors.ConfigError: a.yaml: count: must be a positive integer or "all", not 0
    """
    for key in data:
        if key not in CONFIG_KEYS:
            raise unknown_key(source, "", key, CONFIG_KEYS)
    backend = data.get("backend", "auto")
    if not isinstance(backend, str) or backend.strip().lower() not in BACKENDS:
        raise ConfigError(f"{source}: backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    count = data.get("count")
    if isinstance(count, str) and count.strip().lower() == "all":
        count = None
    elif count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ConfigError(f'{source}: count: must be a positive integer or "all", not {count!r}')
    return AcceleratorConfig(
        source, backend.strip().lower(), _parse_criteria(data.get("criteria"), source), count
    )


def _parse_criteria(raw: Any, source: str) -> tuple[tuple[str, Any], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{source}: criteria: must be a list of mappings, not {type_name(raw)}")
    criteria = []
    for i, entry in enumerate(raw):
        path = f"criteria[{i}]"
        if not isinstance(entry, dict) or not entry:
            raise ConfigError(
                f"{source}: {path}: must be a mapping such as 'vendor: nvidia', not {type_name(entry)}"
            )
        for key, value in entry.items():
            where = f"{source}: {path}.{key}"
            if key == "min_compute_capability":
                criteria.append((key, capability_value(value, where)))
            elif key == "vendor":
                if not isinstance(value, str) or value.strip().lower() not in VENDORS:
                    raise ConfigError(f"{where}: {value!r} is not one of {', '.join(VENDORS)}")
                criteria.append((key, value.strip().lower()))
            elif key == "min_memory_gb":
                number = positive_number(value)
                if number is None:
                    raise ConfigError(
                        f"{where}: must be a positive number of GB (10**9 bytes), not {value!r}"
                    )
                criteria.append((key, number))
            elif key == "name":
                if not isinstance(value, str) or not value.strip():
                    raise ConfigError(f"{where}: must be a non-empty string")
                criteria.append((key, value.strip()))
            else:
                raise unknown_key(source, path, key, CRITERIA_KEYS)
    return tuple(criteria)


def resolve_config_path(
    cli_path: str | None, environ: Mapping[str, str] | None = None
) -> tuple[Path, str] | None:
    """(path, label) of the accelerator config, or None when there is none.

    Example:
        >>> resolve_config_path(None, {"RUNTIME_WORKSPACE": "/nonexistent"}) is None
        True
    """
    env = os.environ if environ is None else environ
    if cli_path:
        if not Path(cli_path).is_file():
            raise ConfigError(f"{cli_path}: accelerator config not found (from --config)")
        return Path(cli_path), cli_path
    env_path = env.get("ACCELERATOR_CONFIG")
    if env_path:
        if not Path(env_path).is_file():
            raise ConfigError(f"{env_path}: accelerator config not found (from ACCELERATOR_CONFIG)")
        return Path(env_path), env_path
    candidate = workspace_dir(env) / CONFIG_FILENAME
    return (candidate, str(candidate)) if candidate.is_file() else None


def load_accelerator_config(
    cli_path: str | None = None, environ: Mapping[str, str] | None = None
) -> AcceleratorConfig | None:
    """Locate and validate the accelerator config (None when absent).

    Example:
        >>> load_accelerator_config(None, {"RUNTIME_WORKSPACE": "/nonexistent"}) is None
        True
    """
    found = resolve_config_path(cli_path, environ)
    if found is None:
        return None
    path, label = found
    return parse_accelerator_config(load_yaml_mapping(path, label), label)


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
        >>> from ml_runtime.probe import ProbeResult
        >>> cfg = AcceleratorConfig("a.yaml", backend="cuda")
        >>> select_devices(cfg, ProbeResult("none", "cpu"), environ={}).problems
        ['backend cuda requested but this host has no NVIDIA accelerator (found: none, CPU only)']
    """
    env = os.environ if environ is None else environ
    host_backend = probe.backend if probe.has_accelerator else "cpu"
    wanted = host_backend if config.backend == "auto" else config.backend
    selection = Selection(backend=wanted, vendor=VENDOR_OF_BACKEND[wanted])
    variable = VISIBILITY_VARIABLE.get(probe.vendor)

    if wanted == "cpu":
        if config.backend == "cpu":
            if config.criteria or config.count:
                selection.notes.append("backend cpu selects no devices; criteria and count are ignored")
        elif config.criteria or config.count:  # auto on a host without an accelerator
            selection.problems.append(
                f"criteria ({_describe(config.criteria)}) ask for devices but this host has no accelerator"
            )
        if probe.has_accelerator and variable:
            if probe.vendor == "intel":
                selection.notes.append(
                    "Intel devices cannot be hidden with ZE_AFFINITY_MASK; they stay visible"
                )
            else:
                selection.variable = variable
                selection.env[variable] = ""
        return selection

    if wanted != host_backend:
        have = f"{VENDOR_LABEL[probe.vendor]} ({host_backend})" if probe.has_accelerator else "none, CPU only"
        selection.problems.append(
            f"backend {wanted} requested but this host has no {VENDOR_LABEL[VENDOR_OF_BACKEND[wanted]]} "
            f"accelerator (found: {have})"
        )
        return selection

    candidates = [d for d in probe.devices if all(_matches(d, k, v) for k, v in config.criteria)]
    candidates.sort(key=lambda d: _sort_key(d, config.criteria))
    wanted_count = config.count if config.count is not None else len(candidates)
    if not candidates:
        selection.problems.append(
            f"no device satisfies the criteria ({_describe(config.criteria)}) among "
            f"{', '.join(d.label() for d in probe.devices)}"
        )
    elif len(candidates) < wanted_count:
        selection.problems.append(
            f"only {len(candidates)} of the requested {wanted_count} devices satisfy the criteria "
            f"({_describe(config.criteria)})"
        )
    selection.devices = candidates[:wanted_count]
    selection.variable = variable
    if variable and selection.devices:
        selection.env[variable] = visible_tokens(variable, [d.index for d in selection.devices], env)
    return selection
