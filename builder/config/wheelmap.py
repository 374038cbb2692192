"""``wheel-mapping.json``: which PyTorch wheel each (backend, accelerator version) takes.

It also carries the run-time facts the launcher, smoke tests and in-image runtime need:
device flags per vendor and the distributed backend per torch range. A site points an
entry at its own mirror without editing the file: ``BUILDER_INDEX_<KEY>=URL`` (key
upper-cased, other characters as ``_``: ``rocm5.7`` -> ``BUILDER_INDEX_ROCM5_7``) or
``--index KEY=URL``.
"""

from __future__ import annotations

import os
import re
from typing import Annotated, Literal

from packaging.requirements import Requirement as PipRequirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from builder.config import grammar as g
from builder.config.matrix import Backend, Requirement, Url

Vendor = Literal["nvidia", "amd", "intel", "cpu"]
#: The vendor behind each backend (ROCm is AMD's, XPU Intel's); a fact, not configuration.
BACKEND_VENDOR: dict[str, Vendor] = {"cuda": "nvidia", "rocm": "amd", "xpu": "intel", "cpu": "cpu"}


def _specifier(value: str) -> str:
    try:
        SpecifierSet(value)
    except InvalidSpecifier:
        raise ValueError(f"{value!r} is not a version range like '>=2.0,<=2.7.1'") from None
    return value


Specifier = Annotated[str, AfterValidator(_specifier)]
DevicePath = Annotated[str, AfterValidator(lambda v: g.check(re.compile(r"/dev/[a-z0-9/_-]+"), v, "a /dev path"))]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class RunFlags(_Strict):
    """How a container gets this vendor's devices (``docker run`` flags)."""

    gpus: bool = Field(False, description="NVIDIA: request all GPUs (--gpus all / DeviceRequest).")
    devices: list[DevicePath] = Field(default_factory=list, description="Device nodes to pass (--device).")
    group_add: list[Annotated[str, AfterValidator(lambda v: g.check(g.DEB_NAME, v, "a group name"))]] = Field(
        default_factory=list, description="Host groups (by name, resolved to GIDs on the host) to add."
    )
    ipc_host: bool = Field(False, description="Share the host IPC namespace (ROCm guides ask for it).")
    shm_size: Annotated[str, AfterValidator(lambda v: g.check(re.compile(r"[0-9]+[kmg]"), v, "a size like 8g"))] = (
        Field("2g", description="--shm-size: data loaders need more than Docker's 64m.")
    )


class VendorFacts(_Strict):
    """Per-vendor run-time facts."""

    visible_devices_env: str | None = Field(
        description="Variable that selects devices for a process (CUDA_VISIBLE_DEVICES, ...)."
    )
    run: RunFlags = Field(default_factory=RunFlags)
    env: dict[
        Annotated[str, AfterValidator(lambda v: g.check(re.compile(r"[A-Z_][A-Z0-9_]*"), v, "an ENV name"))],
        Annotated[str, AfterValidator(lambda v: g.check(g.LABEL_VALUE, v, "an env value"))]] = Field(
        default_factory=dict, description="ENV set in images of this vendor (NVIDIA container runtime)."
    )


class Distributed(_Strict):
    """The torch.distributed backend for a torch range."""

    torch: Specifier = Field(description="torch versions this row applies to.")
    backend: Literal["nccl", "gloo", "xccl", "ccl", "mpi"]


class Entry(_Strict):
    """One wheel source: a backend at one accelerator version."""

    backend: Backend
    version: Annotated[str, AfterValidator(lambda v: g.check(g.ACCEL_VERSION, v, "a version"))] | None = None
    index_url: Url = Field(description="Index holding the wheels (PEP 503 simple or a pip --find-links page).")
    local_version: Annotated[str, AfterValidator(lambda v: g.check(re.compile(r"(\+[a-z0-9.]+)?"), v, "a suffix"))] = (
        Field(description="Local version suffix of torch here: +cu118, +rocm5.7, +xpu, +cpu, or '' (PyPI).")
    )
    torch: Specifier = Field(description="torch releases this index publishes.")
    packages: list[Requirement] = Field(default_factory=list, description="Extra packages for this backend.")
    distributed: list[Distributed] = Field(min_length=1)


class WheelMapping(_Strict):
    """The whole ``wheel-mapping.json``."""

    schema_: str | None = Field(None, alias="$comment")
    vendors: dict[Vendor, VendorFacts]
    entries: dict[Annotated[str, AfterValidator(lambda v: g.check(g.TAG, v, "an entry key"))], Entry]

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _unique(self) -> WheelMapping:
        seen: dict[tuple[str, str | None], str] = {}
        for key, entry in self.entries.items():
            pair = (entry.backend, entry.version)
            if pair in seen:
                raise ValueError(f"entries.{key}: same backend and version as entries.{seen[pair]}")
            seen[pair] = key
        for key, entry in self.entries.items():
            for j, r in enumerate(entry.packages):
                if canonicalize_name(PipRequirement(r).name) == "torch":
                    raise ValueError(f"entries.{key}.packages[{j}]: {r!r}: torch comes from the target's 'torch' "
                                     "and this entry's local_version; remove it")
        missing = {BACKEND_VENDOR[e.backend] for e in self.entries.values()} - set(self.vendors)
        if missing:
            raise ValueError(f"vendors: missing {', '.join(sorted(missing))}")
        return self

    def find(self, backend: str, version: str | None) -> tuple[str, Entry] | None:
        """The (key, entry) for a backend and accelerator version, or None."""
        for key, entry in self.entries.items():
            if entry.backend == backend and entry.version == version:
                return key, entry
        return None


def index_env_var(key: str) -> str:
    """Environment variable that overrides an entry's index.

    Example:
        >>> index_env_var("rocm5.7")
        'BUILDER_INDEX_ROCM5_7'
    """
    return "BUILDER_INDEX_" + re.sub(r"[^A-Z0-9]", "_", key.upper())


def index_for(key: str, entry: Entry, overrides: dict[str, str]) -> str:
    """The index URL to use: ``--index`` beats the environment beats the file."""
    url = overrides.get(key) or os.environ.get(index_env_var(key)) or entry.index_url
    return g.check(g.URL, url, f"a valid index URL for {key}")


def distributed_backend(entry: Entry, torch: str) -> str:
    """The first distributed backend whose torch range contains *torch*."""
    version = Version(torch)
    for row in entry.distributed:
        if version in SpecifierSet(row.torch):
            return row.backend
    return "gloo"
