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

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from builder.config.errors import UserError
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

#: What a wheel file name is, in the words of a message.
WHEEL_NAME = "a wheel file name (PEP 427: name-version-tags.whl, no folder, no '..')"


def wheel_name_problem(filename: str, name: str | None = None, version: str | None = None) -> str | None:
    """Why *filename* is not the plain file name of a wheel (of *name* at *version*, if given); None if it is.

    A wheel's file name comes from outside (an index's URL, a lock line) and names a file in the
    wheelhouse: it is data, never a path. Checked after any decoding: no separator, no ``..``, no NUL,
    not hidden, and :func:`packaging.utils.parse_wheel_filename` reads it.

    Example:
        >>> wheel_name_problem("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "torch", "2.13.0+cpu")
        >>> wheel_name_problem("../../../victim.txt")
        "'../../../victim.txt' is not a wheel file name (PEP 427: name-version-tags.whl, no folder, no '..')"
        >>> wheel_name_problem("foo-1.0-py3-none-any.whl", "bar", "1.0")
        "'foo-1.0-py3-none-any.whl' is a wheel of foo 1.0, not of bar 1.0"
    """
    if (not filename or filename.startswith(".") or any(c in filename for c in "/\\\0")
            or filename != filename.strip()):
        return f"{filename!r} is not {WHEEL_NAME}"
    try:
        wheel_name, wheel_version, _build, _tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion):
        return f"{filename!r} is not {WHEEL_NAME}"
    if name is None or version is None:
        return None
    try:
        same = canonicalize_name(name) == wheel_name and Version(version) == wheel_version
    except InvalidVersion:
        same = False
    return None if same else f"{filename!r} is a wheel of {wheel_name} {wheel_version}, not of {name} {version}"


def read_lock(path: Path) -> tuple[str | None, list[Pin]]:
    """The recorded input fingerprint and the pins of a lock file (None, [] if absent).

    Raises UserError (naming the file and line) for a pin whose ``# <file>`` is not the plain file
    name of that pin's wheel (:func:`wheel_name_problem`): the wheelhouse never reads or removes a path
    a lock names.
    """
    if not path.exists():
        return None, []
    fingerprint, pins = None, []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("# inputs: "):
            fingerprint = line.removeprefix("# inputs: ").strip()
        elif (m := LOCK_LINE.fullmatch(line)) is not None:
            if problem := wheel_name_problem(m["file"], m["name"], m["version"]):
                raise UserError(f"{_shown(path)} line {number}: {problem}; a lock names wheels in the wheelhouse, "
                                f"never paths: delete {_shown(path)} and run `builder lock` to resolve it again")
            pins.append(Pin(m["name"], m["version"], m["sha"], m["file"], m["index"]))
    return fingerprint, pins


def _shown(path: Path) -> str:
    """*path* as a message names it: relative to the working folder when under it."""
    try:
        return str(path.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path)

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
