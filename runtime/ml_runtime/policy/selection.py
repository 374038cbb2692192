"""Device selection from ``accelerator-config.yaml``.

Two ways to choose devices; use one of them (together they are an error).

Compact format::

    backend: auto            # auto | cuda | rocm | xpu (alias oneapi) | cpu
    criteria:                # ordered; devices must satisfy all,
      - min_compute_capability: "sm_80"   # then are sorted by the criteria in order
      - vendor: nvidia                    # nvidia | amd | intel
      - min_memory_gb: 40                 # GB = 10**9 bytes
      - name: "H100"                      # case-insensitive substring of the device name
    count: 2                 # how many to pick (default: all that match)

Sorting: ``min_compute_capability`` prefers newer architectures,
``min_memory_gb`` prefers more memory, ``vendor``/``name`` only filter; ties
keep the device order.

Priority format (the design notes' file, accepted as written)::

    backend: auto            # oneapi is read as xpu
    device_selection_policy:
      - priority: 1          # lower is tried first
        criteria:            # all must hold for a device
          - type: "gpu_compute_capability"    # min or equals: sm_80, gfx90a, pvc, 0x0bd5
            min: "sm_80"
          - type: "driver_version"            # min: the host driver (dotted numbers)
            min: "535.54.03"
      - priority: 2
        criteria:
          - type: "gpu_vendor"                # equals: nvidia | amd | intel (or cuda, rocm, xpu, oneapi)
            equals: "amd"
          # also: {type: memory_gb (or device_memory_gb), min: 40}, {type: name, equals: "H100"}
    runtime_contract: "./runtime-spec.yaml"   # the spec to check, relative to this file
    rocm_config:
      memory_pool_size_mb: 16384   # accepted, no effect (warning)
      use_unified_memory: true     # HSA_XNACK=1 for the command (ROCm only)
    amp_config:
      backend: "native"            # torch.amp, what Accelerate uses anyway
      dtype: "float16"             # ACCELERATE_MIXED_PRECISION=fp16 | bf16 | no
      grad_scaler: true
    count: 2                       # still applies to the winning priority

What a priority policy promises (decisions, for users who read it closely):

* Priorities are tried in ascending order. A device qualifies for a priority
  when every criterion of that priority holds for it; the first priority with
  at least one qualifying device wins and all its qualifying devices are
  chosen, best first (newer architecture, then more memory, in the order the
  criteria name them), cut to ``count`` when given. Devices are never mixed
  across priorities, and ``count`` never moves the choice to a later
  priority: too few qualifying devices is a problem, as in the compact form.
* ``gpu_compute_capability`` is compared with the vendor rules of
  :mod:`ml_runtime.devices.capability`; a device of another vendor never satisfies
  it, so ``min: sm_80`` also means "an NVIDIA GPU". ``equals`` means the same
  architecture (sm_86 does not equal sm_80).
* ``driver_version`` is the host's driver (NVIDIA driver, amdgpu or Intel
  level-zero driver, as probed), compared number by number (535.104.05 >
  535.54.03). An unknown driver version does not satisfy it, with a note.
* When an accelerator is present but no priority matches any device, that is
  a selection problem (strict mode stops, warn mode runs with the visible
  devices untouched): the policy rejected the hardware that is there. When the
  host has no accelerator at all and ``backend`` is ``auto``, the policy only
  ranked accelerators that are absent, so the command runs on CPU with a note
  instead (the runtime spec, not the selection, is where hard hardware
  requirements belong). The compact ``criteria`` keep their stricter meaning:
  criteria on a CPU-only host are a problem.
* Environment for the command (never this process): the vendor's visibility
  variable (``CUDA_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES``,
  ``ZE_AFFINITY_MASK``, composed with a value already set, since torch numbers
  only the devices it can see), ``HSA_XNACK=1`` for
  ``rocm_config.use_unified_memory: true`` when the backend is ROCm, and
  ``ACCELERATE_MIXED_PRECISION`` from ``amp_config.dtype``. A value the caller
  already set for ``HSA_XNACK`` or ``ACCELERATE_MIXED_PRECISION`` is kept
  (a launch-time override wins over the file), with a warning when it differs.
* ``HSA_XNACK=1`` turns on XNACK (GPU page-fault retry, so unified/managed
  memory migrates on demand) on GPUs that support it (gfx90a, gfx942, ...);
  PyTorch still allocates with hipMalloc. ``memory_pool_size_mb`` has no
  equivalent: ROCm has no HIP_MEMORY_POOL_SIZE setting, there is no
  hipMallocManaged pre-reservation, and PyTorch's HIP caching allocator is
  tuned through ``PYTORCH_HIP_ALLOC_CONF``; it is accepted with one warning.
* ``ACCELERATE_MIXED_PRECISION`` is read by Hugging Face Accelerate when a
  program creates ``Accelerator()`` without ``mixed_precision=``; ``accelerate
  launch`` passes its own ``--mixed_precision`` (default ``no``) instead, and
  plain PyTorch code must call ``torch.autocast`` itself (a note says so).
  Accelerate uses torch.amp and a GradScaler for fp16, none for bf16, so
  ``amp_config.backend`` other than ``native`` and contradicting
  ``grad_scaler`` values are warnings. float16 on CPU is not set at all
  (Accelerate does not autocast to fp16 on CPU; older versions refuse it).
* Keys without an effect are accepted with one warning each
  (:attr:`AcceleratorConfig.warnings`, copied into :attr:`Selection.warnings`
  with the selection-dependent ones); unknown keys stay errors with a
  did-you-mean hint, so typos are caught.

``backend: cpu`` hides NVIDIA and AMD devices with an empty variable (Intel
devices cannot be hidden through ZE_AFFINITY_MASK; a note says so).

Config file: ``--config``, else ``$ACCELERATOR_CONFIG``, else
``/workspace/accelerator-config.yaml`` when present.

Example:
    >>> from ml_runtime.devices.probe import ProbeResult, DeviceInfo
    >>> from ml_runtime.devices.capability import nvidia_capability
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

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ml_runtime.contract.spec import (
    capability_value,
    driver_version,
    load_yaml_mapping,
    positive_number,
    type_name,
    unknown_key,
    workspace_dir,
)
from ml_runtime.devices.capability import VENDOR_LABEL, Capability, satisfies
from ml_runtime.devices.probe import VENDOR_OF_BACKEND, VISIBILITY_VARIABLE, DeviceInfo, ProbeResult
from ml_runtime.errors import ConfigError

CONFIG_FILENAME = "accelerator-config.yaml"
BACKENDS = ("auto", "cuda", "rocm", "xpu", "cpu")
BACKEND_ALIASES = {"oneapi": "xpu"}
CRITERIA_KEYS = ("min_compute_capability", "vendor", "min_memory_gb", "name")
CONFIG_KEYS = (
    "backend",
    "criteria",
    "count",
    "device_selection_policy",
    "runtime_contract",
    "rocm_config",
    "amp_config",
)
VENDORS = ("nvidia", "amd", "intel")
VENDOR_ALIASES = {"cuda": "nvidia", "rocm": "amd", "xpu": "intel", "oneapi": "intel"}
# Criterion type -> the comparisons it takes.
POLICY_TYPES: dict[str, tuple[str, ...]] = {
    "gpu_compute_capability": ("min", "equals"),
    "driver_version": ("min",),
    "gpu_vendor": ("equals",),
    "memory_gb": ("min",),
    "device_memory_gb": ("min",),
    "name": ("equals",),
}
POLICY_ENTRY_KEYS = ("priority", "criteria")
POLICY_CRITERION_KEYS = ("type", "min", "equals")
ROCM_KEYS = ("memory_pool_size_mb", "use_unified_memory")
AMP_KEYS = ("backend", "dtype", "grad_scaler")
AMP_DTYPES = {
    "float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float32": "no",
    "fp32": "no",
    "no": "no",
}
SPEC_KEYS = ("required_features", "dependencies")
XNACK_VARIABLE = "HSA_XNACK"
MIXED_PRECISION_VARIABLE = "ACCELERATE_MIXED_PRECISION"
_NUMBERS = re.compile(r"\d+")


@dataclass(frozen=True)
class PolicyCriterion:
    """One ``{type: T, min: X}`` or ``{type: T, equals: X}`` of a priority.

    ``value`` is a :class:`~ml_runtime.devices.capability.Capability`, a vendor name,
    a number of GB or a string, by type; ``type`` is spelled as in the file.

    Example:
        >>> PolicyCriterion("memory_gb", "min", 40.0).describe()
        'memory_gb >= 40'
    """

    type: str
    op: str  # "min" or "equals"
    value: Any

    def describe(self) -> str:
        """Short form such as ``gpu_compute_capability >= sm_80``.

        Example:
            >>> PolicyCriterion("name", "equals", "H100").describe()
            "name contains 'H100'"
        """
        if self.type == "name":
            return f"name contains {self.value!r}"
        if isinstance(self.value, Capability):
            text = self.value.text
        elif isinstance(self.value, float):
            text = f"{self.value:g}"
        else:
            text = str(self.value)
        return f"{self.type} {'>=' if self.op == 'min' else '='} {text}"


@dataclass(frozen=True)
class PolicyEntry:
    """One priority of ``device_selection_policy`` (no criteria: any device).

    Example:
        >>> PolicyEntry(2, (PolicyCriterion("gpu_vendor", "equals", "amd"),)).describe()
        'gpu_vendor = amd'
    """

    priority: int
    criteria: tuple[PolicyCriterion, ...] = ()

    def describe(self) -> str:
        """The criteria, comma-separated.

        Example:
            >>> PolicyEntry(3).describe()
            'any device'
        """
        return ", ".join(c.describe() for c in self.criteria) or "any device"


@dataclass(frozen=True)
class AcceleratorConfig:
    """A validated accelerator-config.yaml.

    ``policy`` is sorted by priority; ``env`` is what ``rocm_config`` and
    ``amp_config`` ask for in the command's environment (applied by
    :func:`select_devices` where it fits the selected backend); ``warnings``
    name accepted keys that have no effect (full sentences, no prefix).

    Example:
        >>> AcceleratorConfig(source="a.yaml").backend
        'auto'
    """

    source: str
    backend: str = "auto"
    criteria: tuple[tuple[str, Any], ...] = ()
    count: int | None = None
    policy: tuple[PolicyEntry, ...] = ()
    runtime_contract: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


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


def looks_like_spec(data: Any) -> bool:
    """True for a loaded mapping that is a runtime spec, not an accelerator config.

    Example:
        >>> looks_like_spec({"required_features": [{"device_memory_gb": 40}], "mode": "warn"})
        True
        >>> looks_like_spec({"backend": "auto", "dependencies": []}), looks_like_spec({})
        (False, False)
    """
    if not isinstance(data, dict):
        return False
    return any(k in data for k in SPEC_KEYS) and not any(k in data for k in CONFIG_KEYS)


def parse_accelerator_config(
    data: dict[str, Any], source: str, base_dir: Path | None = None
) -> AcceleratorConfig:
    """Validate a loaded accelerator-config mapping.

    ``base_dir`` resolves ``runtime_contract`` (default: the directory of
    ``source``); whether that file exists is for the caller to report.

    Example:
        >>> parse_accelerator_config({"count": 0}, "a.yaml")
        Traceback (most recent call last):
        ...
        ml_runtime.errors.ConfigError: a.yaml: count: must be a positive integer or "all", not 0
        >>> data = {"backend": "oneapi", "runtime_contract": "./s.yaml"}
        >>> cfg = parse_accelerator_config(data, "cfg/a.yaml")
        >>> cfg.backend, str(cfg.runtime_contract)
        ('xpu', 'cfg/s.yaml')
    """
    for key in data:
        if key not in CONFIG_KEYS:
            raise unknown_key(source, "", key, CONFIG_KEYS)
    backend = data.get("backend", "auto")
    name = backend.strip().lower() if isinstance(backend, str) else None
    name = BACKEND_ALIASES.get(name, name) if name else name
    if name not in BACKENDS:
        raise ConfigError(
            f"{source}: backend: {backend!r} is not one of {', '.join(BACKENDS)} (or oneapi for xpu)"
        )
    count = data.get("count")
    if isinstance(count, str) and count.strip().lower() == "all":
        count = None
    elif count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ConfigError(f'{source}: count: must be a positive integer or "all", not {count!r}')
    if "criteria" in data and "device_selection_policy" in data:
        raise ConfigError(
            f"{source}: criteria and device_selection_policy cannot be combined; use one "
            "(criteria: one list that devices must satisfy; "
            "device_selection_policy: priorities tried in order)"
        )
    warnings: list[str] = []
    env: dict[str, str] = {}
    _parse_rocm(data.get("rocm_config"), source, env, warnings)
    _parse_amp(data.get("amp_config"), source, env, warnings)
    base = Path(source).parent if base_dir is None else Path(base_dir)
    return AcceleratorConfig(
        source=source,
        backend=name,
        criteria=_parse_criteria(data.get("criteria"), source),
        count=count,
        policy=_parse_policy(data.get("device_selection_policy"), source),
        runtime_contract=_parse_contract(data, source, base),
        env=env,
        warnings=tuple(warnings),
    )


def _parse_criteria(raw: Any, source: str) -> tuple[tuple[str, Any], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{source}: criteria: must be a list of mappings, not {type_name(raw)}")
    criteria: list[tuple[str, Any]] = []
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
                criteria.append((key, _memory_value(value, where)))
            elif key == "name":
                criteria.append((key, _name_value(value, where)))
            else:
                raise unknown_key(source, path, key, CRITERIA_KEYS)
    return tuple(criteria)


def _memory_value(value: Any, where: str) -> float:
    number = positive_number(value)
    if number is None:
        raise ConfigError(f"{where}: must be a positive number of GB (10**9 bytes), not {value!r}")
    return number


def _name_value(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: must be a non-empty string")
    return value.strip()


def _parse_policy(raw: Any, source: str) -> tuple[PolicyEntry, ...]:
    key = "device_selection_policy"
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(
            f"{source}: {key}: must be a list of priorities such as "
            f"'- priority: 1' with criteria, not {type_name(raw)}"
        )
    if not raw:
        raise ConfigError(f"{source}: {key}: is empty; list at least one priority or remove the key")
    entries: list[PolicyEntry] = []
    seen: dict[int, str] = {}
    for i, entry in enumerate(raw):
        path = f"{key}[{i}]"
        _keys_of(entry, source, path, "a mapping with priority and criteria", POLICY_ENTRY_KEYS)
        if "priority" not in entry:
            raise ConfigError(f"{source}: {path}: priority is missing (a positive integer; 1 is tried first)")
        priority = entry["priority"]
        if isinstance(priority, bool) or not isinstance(priority, int) or priority < 1:
            raise ConfigError(f"{source}: {path}.priority: must be a positive integer, not {priority!r}")
        if priority in seen:
            raise ConfigError(
                f"{source}: {path}.priority: {priority} is already used by {seen[priority]}; "
                "each priority must be distinct"
            )
        seen[priority] = path
        if "criteria" not in entry or entry["criteria"] is None:
            raise ConfigError(
                f"{source}: {path}: criteria is missing (a list such as "
                "[{type: gpu_vendor, equals: nvidia}]; [] accepts any device)"
            )
        criteria = entry["criteria"]
        if not isinstance(criteria, list):
            raise ConfigError(
                f"{source}: {path}.criteria: must be a list of mappings, not {type_name(criteria)}"
            )
        parsed = tuple(
            _parse_policy_criterion(c, source, f"{path}.criteria[{j}]") for j, c in enumerate(criteria)
        )
        entries.append(PolicyEntry(priority, parsed))
    return tuple(sorted(entries, key=lambda e: e.priority))


def _keys_of(raw: Any, source: str, path: str, expected: str, allowed: tuple[str, ...]) -> None:
    """*raw* must be a non-empty mapping whose keys are all in *allowed*."""
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{source}: {path}: must be {expected}, not {type_name(raw)}")
    for name in raw:
        if name not in allowed:
            raise unknown_key(source, path, name, allowed)


def _parse_policy_criterion(raw: Any, source: str, path: str) -> PolicyCriterion:
    _keys_of(raw, source, path, "a mapping such as {type: gpu_vendor, equals: nvidia}", POLICY_CRITERION_KEYS)
    types = ", ".join(POLICY_TYPES)
    if "type" not in raw:
        raise ConfigError(f"{source}: {path}: type is missing (allowed: {types})")
    kind = raw["type"]
    if not isinstance(kind, str) or kind.strip().lower() not in POLICY_TYPES:
        close = difflib.get_close_matches(str(kind).strip().lower(), POLICY_TYPES, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"{source}: {path}.type: {kind!r} is not a criterion type ({hint}allowed: {types})")
    kind = kind.strip().lower()
    ops = POLICY_TYPES[kind]
    takes = " or ".join(ops)
    given = [op for op in ("min", "equals") if op in raw]
    if not given:
        raise ConfigError(f"{source}: {path}: {kind} needs {takes}")
    if len(given) == 2:
        raise ConfigError(f"{source}: {path}: give either min or equals, not both")
    op = given[0]
    if op not in ops:
        raise ConfigError(f"{source}: {path}.{op}: {kind} takes {takes}, not {op}")
    value = raw[op]
    where = f"{source}: {path}.{op}"
    if kind == "gpu_compute_capability":
        return PolicyCriterion(kind, op, capability_value(value, where))
    if kind == "driver_version":
        return PolicyCriterion(kind, op, driver_version(value, where))
    if kind == "gpu_vendor":
        return PolicyCriterion(kind, op, _vendor_value(value, where))
    if kind in ("memory_gb", "device_memory_gb"):
        return PolicyCriterion(kind, op, _memory_value(value, where))
    return PolicyCriterion(kind, op, _name_value(value, where))


def _vendor_value(value: Any, where: str) -> str:
    text = value.strip().lower() if isinstance(value, str) else None
    text = VENDOR_ALIASES.get(text, text) if text else text
    if text not in VENDORS:
        raise ConfigError(
            f"{where}: {value!r} is not one of {', '.join(VENDORS)} (or {', '.join(VENDOR_ALIASES)})"
        )
    return text


def _parse_contract(data: dict[str, Any], source: str, base: Path) -> Path | None:
    if "runtime_contract" not in data:
        return None
    value = data["runtime_contract"]
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f'{source}: runtime_contract: must be a non-empty path string such as "./runtime-spec.yaml", '
            f"not {type_name(value) if value != '' else 'an empty string'}"
        )
    return base / value.strip()


def _section(raw: Any, source: str, key: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: {key}: must be a mapping of {', '.join(allowed)}, not {type_name(raw)}")
    for name in raw:
        if name not in allowed:
            raise unknown_key(source, key, name, allowed)
    return raw


def _parse_rocm(raw: Any, source: str, env: dict[str, str], warnings: list[str]) -> None:
    section = _section(raw, source, "rocm_config", ROCM_KEYS)
    if "memory_pool_size_mb" in section:
        size = section["memory_pool_size_mb"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigError(
                f"{source}: rocm_config.memory_pool_size_mb: must be a positive integer of MiB, not {size!r}"
            )
        warnings.append(
            f"rocm_config.memory_pool_size_mb ({size}) has no effect: ROCm has no HIP_MEMORY_POOL_SIZE "
            "setting and no hipMallocManaged pool can be pre-reserved through this file; "
            "PyTorch's HIP caching allocator is configured through PYTORCH_HIP_ALLOC_CONF "
            "(e.g. expandable_segments:True)."
        )
    if "use_unified_memory" in section:
        unified = section["use_unified_memory"]
        if not isinstance(unified, bool):
            raise ConfigError(
                f"{source}: rocm_config.use_unified_memory: must be true or false, not {type_name(unified)}"
            )
        if unified:
            env[XNACK_VARIABLE] = "1"


def _parse_amp(raw: Any, source: str, env: dict[str, str], warnings: list[str]) -> None:
    if raw is None:
        return
    section = _section(raw, source, "amp_config", AMP_KEYS)
    if "dtype" not in section:
        raise ConfigError(f"{source}: amp_config: dtype is missing (float16, bfloat16 or float32)")
    dtype = section["dtype"]
    if dtype is False:  # YAML 1.1 reads an unquoted `no` as the boolean false
        dtype = "no"
    mixed = AMP_DTYPES.get(dtype.strip().lower()) if isinstance(dtype, str) else None
    if mixed is None:
        raise ConfigError(
            f"{source}: amp_config.dtype: {dtype!r} is not one of float16 (fp16, half), "
            "bfloat16 (bf16), float32 (fp32, no)"
        )
    env[MIXED_PRECISION_VARIABLE] = mixed
    if "backend" in section:
        backend = section["backend"]
        if not isinstance(backend, str) or not backend.strip():
            raise ConfigError(f'{source}: amp_config.backend: must be a non-empty string such as "native"')
        if backend.strip().lower() != "native":
            warnings.append(
                f"amp_config.backend {backend.strip()!r} has no effect: Accelerate always uses "
                "PyTorch's native torch.amp."
            )
    if "grad_scaler" in section:
        scaler = section["grad_scaler"]
        if not isinstance(scaler, bool):
            raise ConfigError(
                f"{source}: amp_config.grad_scaler: must be true or false, not {type_name(scaler)}"
            )
        if scaler and mixed == "bf16":
            warnings.append(
                "amp_config.grad_scaler: true is ignored with bfloat16: bf16 needs no loss scaling "
                "and Accelerate uses no GradScaler for it."
            )
        elif scaler and mixed == "no":
            warnings.append(
                "amp_config.grad_scaler: true has no effect with float32: there is no mixed precision "
                "and Accelerate uses no GradScaler."
            )
        elif not scaler and mixed == "fp16":
            warnings.append(
                "amp_config.grad_scaler: false has no effect: Accelerate always scales float16 "
                "gradients with a GradScaler."
            )


def resolve_config_path(
    cli_path: str | Path | None, environ: Mapping[str, str] | None = None
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
        return Path(cli_path), str(cli_path)
    env_path = env.get("ACCELERATOR_CONFIG")
    if env_path:
        if not Path(env_path).is_file():
            raise ConfigError(f"{env_path}: accelerator config not found (from ACCELERATOR_CONFIG)")
        return Path(env_path), env_path
    candidate = workspace_dir(env) / CONFIG_FILENAME
    return (candidate, str(candidate)) if candidate.is_file() else None


def load_accelerator_config(
    cli_path: str | Path | None = None, environ: Mapping[str, str] | None = None
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
    return parse_accelerator_config(load_yaml_mapping(path, label), label, path.parent)


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


def driver_tuple(text: str | None) -> tuple[int, ...]:
    """Numbers of a dotted driver version (suffixes after + or - ignored; () if none).

    Example:
        >>> driver_tuple("535.54.03"), driver_tuple("6.8.5-2041575"), driver_tuple(None)
        ((535, 54, 3), (6, 8, 5), ())
    """
    head = re.split(r"[+\-\s]", (text or "").strip(), maxsplit=1)[0]
    return tuple(int(t) for t in _NUMBERS.findall(head))


def _driver_at_least(found: tuple[int, ...], minimum: tuple[int, ...]) -> bool:
    width = max(len(found), len(minimum))
    return found + (0,) * (width - len(found)) >= minimum + (0,) * (width - len(minimum))


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
        found = driver_tuple(probe.driver_version)
        if not found:
            return f"requires driver >= {value} but the driver version is unknown"
        if _driver_at_least(found, driver_tuple(value)):
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
        >>> from ml_runtime.devices.probe import ProbeResult
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
    variable = VISIBILITY_VARIABLE.get(probe.vendor)

    if wanted == "cpu":
        if config.backend == "cpu":
            if config.policy:
                selection.notes.append(
                    "backend cpu selects no devices; device_selection_policy and count are ignored"
                )
            elif config.criteria or config.count:
                selection.notes.append("backend cpu selects no devices; criteria and count are ignored")
        elif config.policy:  # auto on a host without an accelerator: nothing to rank
            selection.notes.append(
                "no device matched any priority; this host has no accelerator: running on CPU"
            )
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

    if config.policy:
        candidates, describe = _select_by_policy(config, probe, selection)
        if not candidates:
            return selection
    else:
        candidates = [d for d in probe.devices if all(_matches(d, k, v) for k, v in config.criteria)]
        candidates.sort(key=lambda d: _sort_key(d, config.criteria))
        describe = f"the criteria ({_describe(config.criteria)})"
        if not candidates:
            selection.problems.append(
                f"no device satisfies the criteria ({_describe(config.criteria)}) among "
                f"{', '.join(d.label() for d in probe.devices)}"
            )
    wanted_count = config.count if config.count is not None else len(candidates)
    if candidates and len(candidates) < wanted_count:
        selection.problems.append(
            f"only {len(candidates)} of the requested {wanted_count} devices satisfy {describe}"
        )
    selection.devices = candidates[:wanted_count]
    selection.variable = variable
    if variable and selection.devices:
        selection.env[variable] = visible_tokens(variable, [d.index for d in selection.devices], env)
    return selection


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
