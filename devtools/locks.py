"""The hash locks as a user reads them: ``images/<name>.<arch>.lock`` (tools, common) and a target's
``images/<target>/requirements.<arch>.lock`` (its path: ``builder print``'s ``locks``).

One ``name==version --hash=sha256:<hex>  # <file>[  from <index>]`` line per wheel under ``#`` header
lines (the format ``builder lock`` writes: builder/wheels/lockfile.py). devtools imports nothing of
builder, so this reads the lines a user's script would.

Example:
    >>> pins = parse("# Hash lock\\n# inputs: sha256:01\\nuv==0.9.5 --hash=sha256:" + "ab" * 32
    ...              + "  # uv-0.9.5-py3-none-any.whl  from https://pypi.org/simple\\n")
    >>> pins[0].filename, pins[0].requirement()[:28]
    ('uv-0.9.5-py3-none-any.whl', 'uv==0.9.5 --hash=sha256:abab')
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pin:
    """One locked wheel."""

    name: str
    version: str
    sha256: str
    filename: str

    def requirement(self) -> str:
        """The line pip's ``--require-hashes`` takes: ``name==version --hash=sha256:<hex>``."""
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}"


def parse(text: str) -> list[Pin]:
    """The pins of a lock file's text; a line that is neither a comment, blank nor a pin raises."""
    pins = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        try:
            requirement, comment = line.split("  # ", 1)
            spec, digest = requirement.split(" --hash=sha256:")
            name, version = spec.split("==")
        except ValueError:
            raise ValueError(f"not a lock line: {line!r}") from None
        pins.append(Pin(name, version, digest, comment.split()[0]))
    return pins


def read(path: Path) -> list[Pin]:
    """The pins of the lock file at *path* ([] when there is none, as ``builder lock`` reads it)."""
    return parse(path.read_text(encoding="utf-8")) if path.exists() else []


def shared_lock(root: Path, name: str, platform: str) -> Path:
    """A lock every target of *platform* shares: ``images/<name>.<arch>.lock`` (name: tools, common).

    Example:
        >>> shared_lock(Path("/p"), "common", "linux/arm64")
        PosixPath('/p/images/common.arm64.lock')
    """
    return root / "images" / f"{name}.{platform.split('/')[1]}.lock"
