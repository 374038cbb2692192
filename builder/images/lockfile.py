"""The hash lock format: ``images/tools.lock``, ``images/common.lock``, ``images/<target>/requirements.lock``.

One ``name==version --hash=sha256:<hex>  # <file>  from <index>`` line per wheel (``from``: the
index it was resolved from; absent in older locks), sorted by canonical name,
under a header whose ``# inputs:`` line records the fingerprint of what was resolved (so an
unchanged lock is reused, never re-resolved).

Example:
    >>> pins = [Pin("uv", "0.9.5", "ab" * 32, "uv-0.9.5-py3-none-manylinux_2_17_x86_64.whl")]
    >>> write_lock(Path("images/tools.lock"), "the build-time installer", "sha256:0123", pins)
    >>> read_lock(Path("images/tools.lock"))[0]
    'sha256:0123'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from builder.config.files import atomic_write

LOCK_LINE = re.compile(r"(?P<name>[A-Za-z0-9._-]+)==(?P<version>\S+) --hash=sha256:(?P<sha>[0-9a-f]{64})  # (?P<file>\S+)"
                       r"(?:  from (?P<index>\S+))?")


@dataclass(frozen=True)
class Pin:
    """One locked wheel."""

    name: str
    version: str
    sha256: str
    filename: str
    index: str | None = None  # where it was resolved from; not part of line() (fingerprints)

    def line(self) -> str:
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}  # {self.filename}"

    def lock_line(self) -> str:
        return self.line() + (f"  from {self.index}" if self.index else "")

def read_lock(path: Path) -> tuple[str | None, list[Pin]]:
    """The recorded input fingerprint and the pins of a lock file (None, [] if absent)."""
    if not path.exists():
        return None, []
    fingerprint, pins = None, []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# inputs: "):
            fingerprint = line.removeprefix("# inputs: ").strip()
        elif (m := LOCK_LINE.fullmatch(line)) is not None:
            pins.append(Pin(m["name"], m["version"], m["sha"], m["file"], m["index"]))
    return fingerprint, pins

def ordered(pins: list[Pin]) -> list[Pin]:
    """Lock-file order: pip's report order varies, a lock and a fingerprint must not."""
    return sorted(pins, key=lambda p: canonicalize_name(p.name))

def write_lock(path: Path, what: str, fingerprint: str, pins: list[Pin]) -> None:
    header = [
        f"# Hash lock for {what}: written by `builder lock`; do not edit (delete it to re-resolve).",
        f"# inputs: {fingerprint}",
    ]
    body = [p.lock_line() for p in ordered(pins)]
    atomic_write(path, "\n".join(header + body) + "\n")
