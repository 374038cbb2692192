"""``device_selection_policy``, the design notes' form: priorities tried in order, each with criteria.

A criterion is ``{type: T, min: X}`` or ``{type: T, equals: X}``; what a policy promises is in
runtime/README.md ("What a priority policy promises").

Example:
    >>> amd = {"priority": 1, "criteria": [{"type": "gpu_vendor", "equals": "rocm"}]}
    >>> entries = parse_policy([{"priority": 2, "criteria": []}, amd], "a.yaml")
    >>> [(e.priority, e.describe()) for e in entries]
    [(1, 'gpu_vendor = amd'), (2, 'any device')]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ml_runtime.contract.fields import (
    capability_value,
    did_you_mean,
    driver_version,
    memory_gb,
    type_name,
    unknown_key,
)
from ml_runtime.devices.capability import Capability
from ml_runtime.errors import ConfigError

VENDORS = ("nvidia", "amd", "intel")
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

VENDOR_ALIASES = {"cuda": "nvidia", "rocm": "amd", "xpu": "intel", "oneapi": "intel"}

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

def name_value(value: Any, where: str) -> str:
    """Validate a device name (a non-empty string, matched as a case-insensitive substring).

    Example:
        >>> name_value(" H100 ", "a.yaml: name")
        'H100'
    """
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: must be a non-empty string")
    return value.strip()


def parse_policy(raw: Any, source: str) -> tuple[PolicyEntry, ...]:
    """Validate ``device_selection_policy`` (None: no policy); the entries sorted by priority.

    Example:
        >>> parse_policy([], "a.yaml")
        Traceback (most recent call last):
        ...
        ml_runtime.errors.ConfigError: a.yaml: device_selection_policy: is empty; list at least one ...
    """
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
        hint = did_you_mean(str(kind).strip().lower(), tuple(POLICY_TYPES))
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
        return PolicyCriterion(kind, op, memory_gb(value, where))
    return PolicyCriterion(kind, op, name_value(value, where))

def _vendor_value(value: Any, where: str) -> str:
    text = value.strip().lower() if isinstance(value, str) else None
    text = VENDOR_ALIASES.get(text, text) if text else text
    if text not in VENDORS:
        raise ConfigError(
            f"{where}: {value!r} is not one of {', '.join(VENDORS)} (or {', '.join(VENDOR_ALIASES)})"
        )
    return text
