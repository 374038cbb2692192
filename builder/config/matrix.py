"""``matrix.yaml``: the build matrix, validated with pydantic.

Every field is documented where it is declared; ``builder print`` shows the resolved result.
Validation errors are turned into one line per problem by ``builder.config.validation``.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Annotated, Literal

from packaging.requirements import Requirement as PipRequirement
from packaging.utils import canonicalize_name
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from builder.config import grammar as g

Backend = Literal["cuda", "rocm", "xpu", "cpu"]

#: Python version each supported Debian suite ships; the templates use the distribution's python3.
SUITE_PYTHON = {"bookworm": "3.11", "trixie": "3.13"}
#: glibc of each suite, for the manylinux tags the wheel resolver may accept.
SUITE_GLIBC = {"bookworm": (2, 36), "trixie": (2, 41)}


def _grammar(pattern: re.Pattern[str], what: str) -> AfterValidator:
    return AfterValidator(lambda v: g.check(pattern, v, what))


#: Vendor names users write (the design notes' GPU_BACKEND values) for the canonical backends.
BACKEND_ALIASES = {"nvidia": "cuda", "amd": "rocm", "intel": "xpu", "oneapi": "xpu"}
#: Packages whose advice is outdated: refused with the replacement.
RETIRED_PACKAGES = {
    "intel-extension-for-pytorch": "it is retired (last GPU build 2.8.10+xpu): native torch.xpu in the xpu "
    "index's torch (2.5 and later) replaces it; remove it and use an xpu target",
}


def _not_retired(requirement: str) -> str:
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    key = canonicalize_name(name[0]) if name else ""
    if key in RETIRED_PACKAGES:
        raise ValueError(f"{requirement!r}: {RETIRED_PACKAGES[key]}")
    return requirement


Tag = Annotated[str, _grammar(g.TAG, "a Docker tag (lowercase letters, digits, '_', '.', '-'; max 128)")]
Requirement = Annotated[
    str,
    _grammar(g.REQUIREMENT, "a pip requirement like 'name==1.2' (no URLs, markers, quotes or spaces)"),
    AfterValidator(_not_retired),
]
DebName = Annotated[str, _grammar(g.DEB_NAME, "a Debian package or suite name")]
Url = Annotated[str, _grammar(g.URL, "an http(s):// or file:// URL without spaces or quotes")]
Platform = Annotated[str, _grammar(g.PLATFORM, "a platform: linux/amd64 or linux/arm64")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Bootstrap(_Strict):
    """How ``builder base`` makes the base root file system with mmdebstrap."""

    suite: DebName = Field(description="Debian suite: bookworm (Python 3.11) or trixie (Python 3.13).")
    mirror: Url = Field(description="Debian mirror URL given to mmdebstrap.")
    variant: Literal["minbase", "essential", "apt"] = Field(
        "minbase", description="mmdebstrap variant; minbase is the smallest with apt."
    )
    packages: list[DebName] = Field(
        default_factory=list,
        description="Debian packages to include: python3, python3-venv and tini (the images' init) at least.",
    )
    source_date_epoch: int = Field(
        ge=0, description="SOURCE_DATE_EPOCH: fixed timestamps make the tarball and image ID reproducible."
    )

    @model_validator(mode="after")
    def _suite_known(self) -> Bootstrap:
        if self.suite not in SUITE_PYTHON:
            raise ValueError(f"suite {self.suite!r} is not supported (allowed: {', '.join(SUITE_PYTHON)})")
        missing = {"python3", "python3-venv", "tini"} - set(self.packages)
        if missing:
            raise ValueError(f"packages must include {', '.join(sorted(missing))} (the images' Python and init)")
        if self.variant in ("essential", "apt") and "passwd" not in self.packages:
            raise ValueError(f"variant: {self.variant} has no groupadd/useradd (Debian's passwd, Priority required), "
                             "which the Dockerfile's common stage runs; add passwd to packages or use minbase")
        return self


class Base(_Strict):
    """The shared base every target starts from: exactly one of ``image`` or ``bootstrap``."""

    image: Annotated[str, _grammar(g.IMAGE_REF, "an image reference")] | None = Field(
        None,
        description="An existing image, pinned by digest: name@sha256:<64 hex>. It must carry python3, "
        "python3-venv and /usr/bin/tini (the images' init, PID 1).",
    )
    bootstrap: Bootstrap | None = Field(None, description="Build the base locally with mmdebstrap.")
    suite: DebName | None = Field(
        None, description="With image only: the Debian suite the image is based on (for Python and glibc); "
        "with bootstrap, base.bootstrap.suite is the suite."
    )

    @model_validator(mode="after")
    def _one_of(self) -> Base:
        if (self.image is None) == (self.bootstrap is None):
            raise ValueError("give exactly one of 'image' (pinned by digest) or 'bootstrap'")
        if self.image is not None and self.suite not in SUITE_PYTHON:
            raise ValueError(f"with 'image', set 'suite' to one of: {', '.join(SUITE_PYTHON)}")
        if self.bootstrap is not None and self.suite is not None:
            raise ValueError(f"suite: {self.suite!r} is ignored with 'bootstrap' (its suite, "
                             f"{self.bootstrap.suite!r}, is the base's); remove base.suite or set base.bootstrap.suite")
        return self

    @property
    def source_date_epoch(self) -> int:
        """The fixed file time of every layer the images add (the bootstrap's; 2025-01-01 for a given image)."""
        return self.bootstrap.source_date_epoch if self.bootstrap else 1735689600

    @property
    def debian_suite(self) -> str:
        return self.bootstrap.suite if self.bootstrap else str(self.suite)


class Layer(_Strict):
    """One layer of the layer plan: the locked wheels whose names match, installed in one ``RUN``.

    Example (matrix.yaml):
        layers:
          - {name: cuda-dnn, match: ["nvidia-cudnn-*"], backends: [cuda]}
    """

    name: Annotated[str, _grammar(g.LAYER_NAME, "a layer name like cuda-dnn (lowercase, digits, '-')")] = Field(
        description="The layer's name, as `builder print` and the Dockerfile show it."
    )
    match: list[Annotated[str, _grammar(g.WHEEL_PATTERN, "a wheel-name pattern like nvidia-cublas*")]] = Field(
        min_length=1,
        description="fnmatch patterns over canonical wheel names (lowercase, '-'); a wheel goes into the "
        "first layer that matches it.",
    )
    backends: list[Backend] | None = Field(
        None, description="The backends whose targets have this layer (default: every backend)."
    )

    def applies_to(self, backend: str) -> bool:
        return self.backends is None or backend in self.backends


#: The plan's last layer, implicit: every locked wheel no layer matched (torch_packages, a target's packages).
PACKAGES_LAYER = "packages"
#: Names no layer of the plan may take: the last layer's, and those of the layers of wheels the Dockerfile has
#: besides the plan (each a build argument ``WHEELS_<NAME>`` and a context ``wheels-<name>``): the installer's
#: ``tools`` and the shared ``common``.
RESERVED_LAYERS = (PACKAGES_LAYER, "tools", "common")


#: zstd (the default): Docker >= 23.0, containerd >= 1.5, CRI-O, podman and enroot >= 4.0.0 (Slurm's
#: pyxis) pull it, and BuildKit writes and engines decompress it several times faster than gzip.
#: gzip: for older consumers (Docker 20.10, enroot 3); docs/building.md has the table.
Compression = Literal["gzip", "zstd"]


class TargetSpec(_Strict):
    """One image of the matrix, as matrix.yaml's ``targets`` list states it (``project.Target``: resolved)."""

    name: Annotated[str, _grammar(g.TARGET_NAME, "a target name (lowercase letters, digits, '_', '.', '-')")] = (
        Field(description="Primary tag and folder under images/, e.g. nvidia-cu118.")
    )
    backend: Annotated[Backend, BeforeValidator(lambda v: BACKEND_ALIASES.get(v, v) if isinstance(v, str) else v)] = (
        Field(description="Accelerator backend: cuda, rocm, xpu or cpu; the vendor names nvidia, amd, intel and "
              "oneapi are accepted for them (builder print shows the canonical name).")
    )
    version: Annotated[str, _grammar(g.ACCEL_VERSION, "an accelerator version like 11.8 or 5.7")] | None = (
        Field(None, description="Accelerator version (CUDA 11.8, ROCm 5.7); none for cpu and xpu.")
    )
    torch: Annotated[str, _grammar(g.VERSION, "a torch version like 2.7.1 (no local suffix)")] = Field(
        description="torch release; the wheel mapping adds the local suffix (+cu118 ...)."
    )
    packages: list[Requirement] = Field(default_factory=list, description="Extra pip requirements.")
    labels: dict[
        Annotated[str, _grammar(g.LABEL_KEY, "a label key (reverse-DNS: lowercase, digits, '.', '-')")],
        Annotated[str, _grammar(g.LABEL_VALUE, "a label value (no quotes, backslashes, $ or newlines)")],
    ] = Field(default_factory=dict, description="Extra image labels.")
    tags: list[Tag] = Field(default_factory=list, description="Extra tags besides the generated ones.")
    platforms: list[Platform] | None = Field(
        None, min_length=1,
        description="Platforms this target is built for, e.g. [linux/amd64, linux/arm64]; default: the top-level "
        "platforms. Each gets its own base, lock, content tag and smoke test; the published tags are one index.",
    )

    compression: Compression | None = Field(
        None, description="Layer compression of this target's image; default: the top-level compression.",
    )

    k8s_resource: Literal["nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe"] | None = Field(
        None,
        description="The Kubernetes extended resource `builder k8s` asks for, as the cluster's device plugin "
        "names it; default: nvidia.com/gpu, amd.com/gpu, gpu.intel.com/i915 by vendor (Intel's xe driver: "
        "gpu.intel.com/xe). `builder k8s --gpu-resource` overrides it.",
    )

    @model_validator(mode="after")
    def _torch_plain(self) -> TargetSpec:
        if "+" in self.torch:
            raise ValueError("torch: give the release without a local suffix; the wheel mapping adds it")
        vendor = {"cuda": "nvidia.com/", "rocm": "amd.com/", "xpu": "gpu.intel.com/"}.get(self.backend)
        if self.k8s_resource and (vendor is None or not self.k8s_resource.startswith(vendor)):
            raise ValueError(f"k8s_resource: {self.k8s_resource} is not a resource of backend {self.backend}; "
                             f"leave it out{' (cpu targets ask for no GPU)' if vendor is None else ''}")
        return self


class Matrix(_Strict):
    """The whole ``matrix.yaml``."""

    registry: Annotated[str, _grammar(g.REGISTRY, "host[:port]/repository, e.g. localhost:5000/ml-runtime")] = (
        Field(description="Where images are pushed: host[:port]/repository.")
    )
    source: Url | None = Field(None, description="Project URL for the org.opencontainers.image.source label.")
    base: Base = Field(description="The shared, digest-pinned base.")
    python: str = Field(description="Python version in the images; must be the base suite's python3.")
    installer: Requirement = Field(
        description="Pinned uv used only during the build (never left in an image), e.g. uv==0.13.9."
    )
    common_packages: list[Requirement] = Field(
        default_factory=list,
        description="Backend-independent packages in the shared layer (byte-identical in every target).",
    )
    torch_packages: list[Requirement] = Field(
        default_factory=list,
        description="Packages every target installs beside torch (they depend on it), e.g. accelerate.",
    )
    startup_imports: list[Annotated[str, _grammar(g.MODULE, "a Python module name like torch")]] = Field(
        default_factory=lambda: ["torch"],
        description="Modules imported once at build time so their bytecode ships in the image (fast start); "
        "at least one, each installed in every target (torch, torch_packages, common_packages).",
    )
    layers: list[Layer] = Field(
        default_factory=lambda: [Layer(name="wheels", match=["*"])], min_length=1,
        description="The layer plan: each target's locked wheels are installed in these layers, in this "
        "order; what none matches goes into a last layer, 'packages', above the in-image runtime (so it "
        "must not hold what startup_imports needs). Default: one layer, 'wheels', for every wheel.",
    )
    compression: Compression = Field(
        "zstd",
        description="Layer compression of the published images: zstd (the default: Docker >= 23.0, containerd "
        ">= 1.5, CRI-O, podman and enroot >= 4.0.0 pull it; faster builds and pulls) or gzip (older consumers: "
        "Docker 20.10, enroot 3). A target may "
        "set its own. BuildKit writes it in the containerd image store, and `builder doctor` warns when this "
        "engine could not pull what the matrix publishes.",
    )
    platforms: list[Platform] | None = Field(
        None, min_length=1,
        description="Platforms every target is built for unless it names its own; default: this host's "
        "(linux/amd64 on x86_64, linux/arm64 on aarch64). A foreign one builds under qemu emulation.",
    )
    targets: list[TargetSpec] = Field(min_length=1, description="The images to build.")
    groups: dict[Annotated[str, _grammar(g.TARGET_NAME, "a group name")], list[str]] = Field(
        default_factory=dict, description="Named sets of targets (default, all, ...), like bake groups."
    )

    @model_validator(mode="after")
    def _consistent(self) -> Matrix:
        problems = []
        names = [t.name for t in self.targets]
        dups = sorted({n for n in names if names.count(n) > 1})
        if dups:
            problems.append(f"targets: duplicate name(s) {', '.join(dups)}; each name must be unique")
        expected = SUITE_PYTHON.get(self.base.debian_suite)
        if self.python != expected:
            problems.append(
                f"python: {self.python!r} is not supported with suite {self.base.debian_suite!r} "
                f"(the templates use its python3: {expected})"
            )
        problems += _platforms_twice(self) + _layer_names(self.layers)
        if not self.installer.startswith("uv=="):
            problems.append(f"installer: {self.installer!r} must pin uv exactly, e.g. uv==0.13.9")
        problems += _group_problems(self.groups, names)
        if self.platforms and all(t.platforms for t in self.targets):
            problems.append(f"platforms: {self.platforms} applies to no target (every target names its own "
                            "platforms); remove it, or the platforms of the targets that should use it")
        problems += _torch_elsewhere(self) + _startup_problems(self) + _dead_layers(self.layers)
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def group(self, name: str) -> list[str]:
        """Target names of a group; ``all`` and ``default`` default to every target."""
        if name in self.groups:
            return list(self.groups[name])
        if name in ("all", "default"):
            return [t.name for t in self.targets]
        raise KeyError(name)


def requirement_name(requirement: str) -> str:
    """The canonical project name of a PEP 508 requirement.

    Example:
        >>> requirement_name("Einops==0.8.1")
        'einops'
    """
    return canonicalize_name(PipRequirement(requirement).name)


def _platforms_twice(m: Matrix) -> list[str]:
    """Platform lists (the top level's, a target's) that name a platform twice."""
    return [f"{where}: {listed} names a platform twice; list each once"
            for where, listed in [("platforms", m.platforms),
                                  *((f"targets.{t.name}.platforms", t.platforms) for t in m.targets)]
            if listed and len(set(listed)) != len(listed)]


def _layer_names(layers: list[Layer]) -> list[str]:
    """Layer names used twice, or reserved (:data:`RESERVED_LAYERS`)."""
    names = [layer.name for layer in layers]
    return [f"layers: {name!r} is used twice or reserved ({', '.join(map(repr, RESERVED_LAYERS))} name the "
            "Dockerfile's own layers); give each layer its own name"
            for name in sorted({n for n in names if names.count(n) > 1 or n in RESERVED_LAYERS})]


def _group_problems(groups: dict[str, list[str]], names: list[str]) -> list[str]:
    """Groups naming an unknown target or one twice, empty, or named like a target."""
    problems = []
    for group, members in groups.items():
        unknown = [m for m in members if m not in names]
        if unknown:
            problems.append(f"groups.{group}: unknown target(s) {', '.join(unknown)} (known: {', '.join(names)})")
        if not members:
            problems.append(f"groups.{group}: an empty group selects no target; list its targets or remove it")
        if len(set(members)) != len(members):
            problems.append(f"groups.{group}: {members} names a target twice; list each once")
        if group in names:
            problems.append(f"groups.{group}: a target has this name too (-t {group} means the target); "
                            "rename the group")
    return problems


def _torch_elsewhere(m: Matrix) -> list[str]:
    """torch set by a package list beside ``targets[].torch`` (and the wheel mapping's suffix), or a
    target's package also in common_packages (the common pin silently wins)."""
    problems = []
    common = {requirement_name(r): r for r in m.common_packages}
    lists = [("common_packages", m.common_packages), ("torch_packages", m.torch_packages),
             *((f"targets[{i}].packages", t.packages) for i, t in enumerate(m.targets))]
    for where, requirements in lists:
        for j, r in enumerate(requirements):
            if requirement_name(r) == "torch":
                problems.append(f"{where}[{j}]: {r!r}: torch comes from the target's 'torch' key and the wheel "
                                "mapping; remove it here and set targets[].torch")
            elif where.startswith("targets") and requirement_name(r) in common:
                problems.append(f"{where}[{j}]: {r!r} is in common_packages too ({common[requirement_name(r)]!r}), whose "
                                "pin every target shares; keep it in one of the two")
    return problems


def _startup_problems(m: Matrix) -> list[str]:
    """startup_imports the build can never import: none at all (``import`` with no module is a syntax
    error), or a module only some targets' own packages install (every target's build imports it)."""
    if not m.startup_imports:
        return [("startup_imports: [] leaves the build's start-up step 'import' with no module (a syntax error); "
                 "list at least torch, or leave the key out (default: [torch])")]
    everywhere = {"torch", *map(requirement_name, m.common_packages), *map(requirement_name, m.torch_packages)}
    problems = []
    for i, module in enumerate(m.startup_imports):
        name = canonicalize_name(module.split(".")[0])
        having = [t.name for t in m.targets if name in map(requirement_name, t.packages)]
        if name not in everywhere and having and len(having) < len(m.targets):
            lacking = [t.name for t in m.targets if t.name not in having]
            problems.append(f"startup_imports[{i}]: {module!r} is installed only by the packages of "
                            f"{', '.join(having)}, but every target's build imports it ({', '.join(lacking)} "
                            "too); add it to torch_packages or common_packages, or remove it here")
    return problems


def _covers(earlier: str, pattern: str) -> bool:
    """Every name *pattern* matches, *earlier* matches too (for the forms used: exact, prefix*)."""
    if earlier == "*" or earlier == pattern:
        return True
    if earlier.endswith("*") and not any(c in earlier[:-1] for c in "*?["):
        return pattern.startswith(earlier[:-1])
    return not any(c in pattern for c in "*?[") and fnmatch.fnmatchcase(pattern, earlier)


def _dead_layers(layers: list[Layer]) -> list[str]:
    """Layers that can never receive a wheel: no backend, or every pattern taken by an earlier layer."""
    problems = []
    for i, layer in enumerate(layers):
        if layer.backends == []:
            problems.append(f"layers[{i}] ({layer.name}): backends: [] applies to no target; list backends or "
                            "leave the key out (every backend)")
            continue
        before = [e for e in layers[:i]
                  if e.backends is None or (layer.backends is not None and set(layer.backends) <= set(e.backends))]
        dead = [p for p in layer.match if any(_covers(q, p) for e in before for q in e.match)]
        if dead and len(dead) == len(layer.match):
            problems.append(f"layers[{i}] ({layer.name}): {', '.join(dead)} always match(es) an earlier layer "
                            "first (a wheel goes into the first layer that matches it); move this layer up")
    return problems
