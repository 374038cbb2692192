"""``base.lock.json``: the digest the shared base is pinned to, committed beside matrix.yaml.

Written by ``builder base``; read by ``builder render`` for every target's ``FROM``. It also
records the Debian packages inside the base, so drift after a mirror update can be reported
package by package.
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


class BaseLock(BaseModel):
    """What ``builder base`` made, and how."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    reference: Annotated[str, AfterValidator(lambda v: g.check(g.PINNED_IMAGE, v, "a reference pinned by digest"))] = (
        Field(description="Registry reference pinned by manifest digest; every FROM uses it.")
    )
    image_id: Annotated[str, AfterValidator(lambda v: g.check(g.IMAGE_ID, v, "an image ID (sha256:<64 hex>)"))] = (
        Field(description="Local image ID (config digest): identical for identical bootstraps.")
    )
    spec_sha256: str = Field(description="Hash of the bootstrap spec this base was made from.")
    packages: dict[str, str] = Field(default_factory=dict, description="Debian package -> version inside.")


def read_lock(root: Path) -> BaseLock | None:
    """The lock beside matrix.yaml, or None if there is none yet."""
    path = root / LOCK_NAME
    if not path.exists():
        return None
    try:
        return BaseLock.model_validate_json(path.read_text(encoding="utf-8"))
    except ValidationError as exc:
        raise UserError(*format_errors(path, BaseLock, exc)) from None


def write_lock(root: Path, lock: BaseLock) -> Path:
    """Write the lock atomically (a crash leaves the old one)."""
    path = root / LOCK_NAME
    text = json.dumps(lock.model_dump(), indent=2, sort_keys=True) + "\n"
    atomic_write(path, text)
    return path
