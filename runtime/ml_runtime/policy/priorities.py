"""``device_selection_policy``, the design notes' form: priorities tried in order, each with criteria.

A criterion is ``{type: T, min: X}`` or ``{type: T, equals: X}``; what a policy promises is in
runtime/README.md ("What a priority policy promises"). The file's entries are validated by
:class:`ml_runtime.policy.config_file.PolicyPriority`; here is what selection works on.

Example:
    >>> entries = policy_entries([(2, []), (1, [("gpu_vendor", "equals", "amd")])])
    >>> [(e.priority, e.describe()) for e in entries]
    [(1, 'gpu_vendor = amd'), (2, 'any device')]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ml_runtime.devices.capability import Capability

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


def policy_entries(
    priorities: Iterable[tuple[int, Iterable[tuple[str, str, Any]]]],
) -> tuple[PolicyEntry, ...]:
    """(priority, [(type, op, value), ...]) pairs as PolicyEntry values, sorted by priority.

    Example:
        >>> policy_entries([(1, [("memory_gb", "min", 40.0)])])[0].describe()
        'memory_gb >= 40'
    """
    entries = (PolicyEntry(p, tuple(PolicyCriterion(*c) for c in criteria)) for p, criteria in priorities)
    return tuple(sorted(entries, key=lambda e: e.priority))
