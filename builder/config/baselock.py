"""``base.lock.json``: the digest the shared base is pinned to per platform, committed beside matrix.yaml.

Written by ``builder base``; read by ``builder build`` for every target's ``FROM`` (the
platform's pin) and by ``builder render`` for the pins the Dockerfile names. It also records
the Debian packages inside each base, so drift after a mirror update can be reported package
by package.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from builder.config import grammar as g
from builder.config.errors import UserError
from builder.config.files import atomic_write
from builder.config.validation import format_errors

LOCK_NAME = "base.lock.json"


class PinnedBase(BaseModel):
    """One platform's base, as ``builder base`` made and pushed it."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    reference: Annotated[str, AfterValidator(lambda v: g.check(g.PINNED_IMAGE, v, "a reference pinned by digest"))] = (
        Field(description="Registry reference pinned by manifest digest; this platform's builds start FROM it.")
    )
    image_id: Annotated[str, AfterValidator(lambda v: g.check(g.IMAGE_ID, v, "an image ID (sha256:<64 hex>)"))] = (
        Field(description="Local image ID (config digest): identical for identical bootstraps.")
    )
    packages: dict[str, str] = Field(default_factory=dict, description="Debian package -> version inside.")
    recipe_sha256: str | None = Field(
        default=None, description="Hash of how the builder bootstrapped it (mmdebstrap's arguments and hooks, the "
        "tarball's format): another recipe makes other bytes of the same packages. Absent in locks written before "
        "it was recorded.")


class BaseLock(BaseModel):
    """What ``builder base`` made, per platform, and from which spec."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    spec_sha256: str = Field(description="Hash of the bootstrap spec every platform's base was made from.")
    platforms: dict[
        Annotated[str, AfterValidator(lambda v: g.check(g.PLATFORM, v, "a platform: linux/amd64 or linux/arm64"))],
        PinnedBase,
    ] = Field(default_factory=dict, description="Platform (linux/amd64, linux/arm64) -> its pinned base.")

    def with_platform(self, platform: str, pinned: PinnedBase) -> BaseLock:
        """This lock with *platform*'s entry set (the others kept)."""
        return self.model_copy(update={"platforms": {**self.platforms, platform: pinned}})


def read_base_lock(root: Path) -> BaseLock | None:
    """The lock beside matrix.yaml, or None if there is none yet."""
    path = root / LOCK_NAME
    if not path.exists():
        return None
    try:
        return BaseLock.model_validate_json(path.read_text(encoding="utf-8"))
    except ValidationError as exc:
        raise UserError(*format_errors(path, BaseLock, exc)) from None


def write_base_lock(root: Path, lock: BaseLock) -> Path:
    """Write the lock atomically (a crash leaves the old one)."""
    path = root / LOCK_NAME
    text = json.dumps(lock.model_dump(), indent=2, sort_keys=True) + "\n"
    atomic_write(path, text)
    return path
