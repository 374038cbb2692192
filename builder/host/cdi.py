"""The host's CDI specs (Container Device Interface): which kinds and device names they declare.

A spec is a YAML or JSON file in ``/etc/cdi`` or ``/var/run/cdi`` (``nvidia-ctk cdi generate``,
AMD's ``amd-ctk cdi generate``, Intel's generator) with a ``kind`` (``vendor.com/class``) and the
``devices`` it declares by name; ``--device nvidia.com/gpu=0`` asks the engine for one of them.
No maintained Python parser of CDI specs exists (the reference is the Go module
``tags.cncf.io/container-device-interface``), so the fields the builder reads are pydantic models
here, with the Go parser's name rules; the edits (``containerEdits``) are the engine's to apply
and are not read. A spec that breaks the rules is skipped, as the engines skip it.

Example:
    >>> [(s.kind, s.names) for s in specs()]  # doctest: +SKIP
    [('nvidia.com/gpu', ('0', 'all'))]
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

#: Where the engines look for specs, in their order (a device in a later folder wins).
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
#: ``vendor/class``: each starts with a letter, ends with a letter or digit, ``_-.`` between.
_SEGMENT = r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?"
KIND = re.compile(rf"{_SEGMENT}/{_SEGMENT}")
#: A device name: a letter or digit at both ends, ``_-.:`` between.
DEVICE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?")


class _Device(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: Annotated[str, StringConstraints(pattern=rf"^{DEVICE_NAME.pattern}$")]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="allow")

    cdiVersion: str
    kind: Annotated[str, StringConstraints(pattern=rf"^{KIND.pattern}$")]
    devices: list[_Device] = Field(default_factory=list)


@dataclass(frozen=True)
class Spec:
    """One spec file: its path, kind and device names, in the file's order."""

    path: str
    kind: str
    names: tuple[str, ...]


def read(path: Path | str) -> Spec | None:
    """The spec in *path*, or None when it is not one (unreadable, not YAML/JSON, against the rules).

    Example:
        >>> read("/etc/cdi/nvidia.yaml").names  # doctest: +SKIP
        ('0', 'all')
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        spec = _Spec.model_validate(doc)
    except (OSError, UnicodeError, ValueError, yaml.YAMLError, ValidationError):
        return None  # a broken spec is the CDI tooling's to report; the engines skip it too
    return Spec(str(path), spec.kind, tuple(d.name for d in spec.devices))


def specs(dirs: Iterable[Path | str] = CDI_DIRS, kind: str | None = None) -> list[Spec]:
    """Every valid spec in *dirs* (files ending ``.yaml``, ``.yml`` or ``.json``), only *kind*'s if given.

    Example:
        >>> [s.path for s in specs(kind="nvidia.com/gpu")]  # doctest: +SKIP
        ['/var/run/cdi/nvidia.yaml']
    """
    found = []
    for folder in dirs:
        for path in sorted(Path(folder).glob("*")):
            if path.suffix not in (".yaml", ".yml", ".json") or not path.is_file():
                continue
            spec = read(path)
            if spec is not None and (kind is None or spec.kind == kind):
                found.append(spec)
    return found


def qualified(kind: str, found: Sequence[Spec]) -> tuple[str, ...]:
    """The names to ask for every device of *kind*: ``kind=all`` where a spec declares ``all``
    (nvidia-ctk and amd-ctk do), else each declared device (``kind=0``, ``kind=1``, ...).

    Example:
        >>> qualified("example.com/gpu", [Spec("/etc/cdi/x.yaml", "example.com/gpu", ("0", "1"))])
        ('example.com/gpu=0', 'example.com/gpu=1')
    """
    names = dict.fromkeys(n for s in found if s.kind == kind for n in s.names)
    return (f"{kind}=all",) if "all" in names else tuple(f"{kind}={n}" for n in names)
