"""What happened to one target in ``builder build``: shared by the build and its progress view."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Outcome:
    """What happened to one target; ``--json`` prints a list of these."""

    target: str
    #: the platform this image is for (linux/amd64, linux/arm64)
    platform: str | None = None
    tags: list[str] = field(default_factory=list)
    image_id: str | None = None
    size_bytes: int | None = None
    seconds: float = 0.0
    steps: int = 0
    cached_steps: int = 0
    smoke: str = "skipped"
    digest: str | None = None
    error: str | None = None
    #: built, reused-local (the content tag was here) or reused-registry (the registry had it)
    result: str | None = None
    #: <registry>:<target>-<12 hex>: this exact content, built and smoke-tested
    content_tag: str | None = None
    #: the registry caches the build read (``--push`` exports one per target and platform)
    cache_read: tuple[str, ...] = ()
    #: what the smoke test left out, and why (no GPU here, emulation)
    notes: list[str] = field(default_factory=list)
    #: where a build's time went, BuildKit's seconds per phase: steps, context, base and cache, export, other
    phases: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
