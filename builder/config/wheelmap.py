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

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from builder.config import grammar as g
from builder.config.matrix import Backend, Requirement, Url, requirement_name
from builder.config.urls import public

Vendor = Literal["nvidia", "amd", "intel", "cpu"]
#: The vendor behind each backend (ROCm is AMD's, XPU Intel's); a fact, not configuration.
BACKEND_VENDOR: dict[str, Vendor] = {"cuda": "nvidia", "rocm": "amd", "xpu": "intel", "cpu": "cpu"}

#: Variables a vendor's ``env`` may not set, because the builder sets them itself: the template's
#: ENV of the common stage (the vendor's ENV comes later and would override them: the venv's
#: PATH...) and of the last stage (which overrides the vendor's), the template's build arguments
#: (an ENV of the same name overrides an ARG), the base's fixed file times, and what
#: ``builder k8s``/``builder slurm`` set in every container of a job.
BUILDER_ENV = frozenset({
    "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PIP_NO_CACHE_DIR", "PIP_DISABLE_PIP_VERSION_CHECK",
    "VIRTUAL_ENV", "PATH", "TINI_SUBREAPER", "BASE", "EMULATED", "SOURCE_DATE_EPOCH",
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "RANK",
})
#: Prefixes of builder-owned variables: the in-image runtime's (ML_RUNTIME_TORCH ...) and the
#: layer plan's build arguments (WHEELS_<LAYER>).
BUILDER_ENV_PREFIXES = ("ML_RUNTIME_", "WHEELS_")
#: The local version suffix PyTorch's own indexes give torch, per backend (cuda/rocm: with the version).
PYTORCH_SUFFIX = re.compile(r"\+(cu[0-9]+|rocm[0-9.]+|xpu|cpu)")
#: Indexes that publish no local versions (PyPI refuses uploads with one).
NO_LOCAL_VERSIONS = re.compile(r"https://(pypi\.org|pypi\.python\.org|files\.pythonhosted\.org)/.*")


def pytorch_suffix(backend: str, version: str | None) -> str:
    """The suffix PyTorch's index for a backend and accelerator version gives torch.

    Example:
        >>> pytorch_suffix("cuda", "11.8"), pytorch_suffix("rocm", "5.7"), pytorch_suffix("xpu", None)
        ('+cu118', '+rocm5.7', '+xpu')
    """
    if backend == "cuda":
        return f"+cu{(version or '').replace('.', '')}"
    if backend == "rocm":
        return f"+rocm{version or ''}"
    return f"+{backend}"


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
        default_factory=dict, description="ENV set in images of this vendor (NVIDIA container runtime); "
        "not a variable the builder sets itself (BUILDER_ENV, ML_RUNTIME_*, WHEELS_*)."
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
        problems = []
        seen: dict[tuple[str, str | None], str] = {}
        for key, entry in self.entries.items():
            pair = (entry.backend, entry.version)
            if pair in seen:
                problems.append(f"entries.{key}: same backend and version as entries.{seen[pair]}")
            seen.setdefault(pair, key)
        for key, entry in self.entries.items():
            for j, r in enumerate(entry.packages):
                if requirement_name(r) == "torch":
                    problems.append(f"entries.{key}.packages[{j}]: {r!r}: torch comes from the target's 'torch' "
                                    "and this entry's local_version; remove it")
            problems += _suffix_problems(key, entry)
        missing = {BACKEND_VENDOR[e.backend] for e in self.entries.values()} - set(self.vendors)
        if missing:
            problems.append(f"vendors: missing {', '.join(sorted(missing))}")
        for vendor, facts in self.vendors.items():
            for name in facts.env:
                if name in BUILDER_ENV or name.startswith(BUILDER_ENV_PREFIXES):
                    problems.append(f"vendors.{vendor}.env.{name}: the builder sets this variable itself (the "
                                    "Dockerfile's ENV or build arguments, the runtime, the cluster launchers), "
                                    "so one of the two values would be overridden; remove it")
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def find(self, backend: str, version: str | None) -> tuple[str, Entry] | None:
        """The (key, entry) for a backend and accelerator version, or None."""
        for key, entry in self.entries.items():
            if entry.backend == backend and entry.version == version:
                return key, entry
        return None


def _suffix_problems(key: str, entry: Entry) -> list[str]:
    """A local_version that contradicts the entry: PyTorch's suffix of another build, or one on an
    index that publishes no local versions (torch==<release><suffix> could never resolve there)."""
    suffix, expected = entry.local_version, pytorch_suffix(entry.backend, entry.version)
    where = f"entries.{key}.local_version"
    if PYTORCH_SUFFIX.fullmatch(suffix) and suffix != expected:
        version = f" {entry.version}" if entry.version else ""
        return [(f"{where}: {suffix!r} is the suffix of another build than {entry.backend}{version}; write "
                 f"{expected!r} (or '' where the index publishes torch without one)")]
    if suffix and NO_LOCAL_VERSIONS.fullmatch(entry.index_url):
        return [(f"{where}: {suffix!r}: {public(entry.index_url)} publishes no local versions, so "
                 f"torch==<release>{suffix} never resolves there; write '' or point index_url at the index that "
                 "has them")]
    return []


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
