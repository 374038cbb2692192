"""The outcome of one contract item: what was found, whether it holds, why not, what would.

The checks (:mod:`ml_runtime.contract.checks`, :mod:`ml_runtime.contract.packages`) return
these; the reporters (:mod:`ml_runtime.report`) print them.

Example:
    >>> CheckResult("device_memory_gb", "42.5 GB", True, ">= 40 GB of device memory").status("warn")
    'OK'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
