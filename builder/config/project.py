"""Load and resolve a project: matrix.yaml + wheel-mapping.json + base.lock.json.

The result is everything a build needs, with nothing left implicit: tags, labels, the
torch pin with its local suffix, the index (after mirror overrides), device flags and the
distributed backend. ``builder print`` dumps it; every other command starts from it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version
from pydantic import ValidationError

from builder.config import grammar as g
from builder.config import platforms
from builder.config.baselock import LOCK_NAME, read_base_lock
from builder.config.errors import UserError
from builder.config.loaders import load_json, load_yaml
from builder.config.matrix import PACKAGES_LAYER, SUITE_GLIBC, Matrix, TargetSpec
from builder.config.tags import base_repository, base_tag, generated, is_alias, platform_tag
from builder.config.urls import public
from builder.config.validation import format_errors
from builder.config.wheelmap import (
    BACKEND_VENDOR,
    Entry,
    RunFlags,
    WheelMapping,
    distributed_backend,
    index_for,
)

LABEL_PREFIX = "io.ml-image-builder"
#: OCI labels the builder writes on every image (project.py, build.py): not a target's to set.
BUILDER_LABELS = frozenset(f"org.opencontainers.image.{k}" for k in ("title", "version", "source", "revision",
                                                                     "created"))


@dataclass(frozen=True)
class Target:
    """One target with every value worked out: what holds on each of its platforms.

    What depends on the platform (lock, arch, the local tags) is a :class:`TargetView`'s.
    """

    name: str
    backend: str
    vendor: str
    accelerator_version: str | None
    torch: str
    torch_pin: str
    entry: str
    index_url: str
    packages: list[str]
    distributed: str
    tags: list[str]
    refs: list[str]
    labels: dict[str, str]
    env: dict[str, str]
    run: dict[str, Any]
    visible_devices_env: str | None
    dockerfile: str
    platforms: list[str]
    #: The layer plan's layers this target has (its backend's, then ``packages``), in install order.
    layers: list[str] = field(default_factory=lambda: [PACKAGES_LAYER])
    #: The Kubernetes resource ``builder k8s`` asks for (matrix key k8s_resource; None: the vendor's default).
    k8s_resource: str | None = None
    #: Layer compression of the image (matrix key compression, the target's or the top level's).
    compression: str = "zstd"

    @property
    def primary_ref(self) -> str:
        return self.refs[0]

    def on(self, platform: str) -> TargetView:
        """This target on one of its platforms."""
        if platform not in self.platforms:
            raise UserError(f"--platform: target {self.name} is built for {', '.join(self.platforms)}, not "
                            f"{platform}; add it to the target's platforms in matrix.yaml")
        return TargetView(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Target)}, platform=platform)

    def views(self, only: Sequence[str] = ()) -> list[TargetView]:
        """One view per platform of the target (those in *only*, when given, that it has)."""
        return [self.on(p) for p in self.platforms if not only or p in only]

    @property
    def default_view(self) -> TargetView:
        """The target on its default platform: the host's when listed, else the first.

        Example:
            >>> project.target("cpu").default_view.platform == platforms.host_platform()
            True
        """
        host = platforms.host_platform()
        return self.on(host if host in self.platforms else self.platforms[0])

    @property
    def flavour(self) -> str:
        """The build flavour torch reports in the image, as the runtime's probe names it.

        Example:
            >>> project.target("nvidia-cu130").flavour, project.target("cpu").flavour
            ('cuda 13.0', 'cpu')
        """
        if self.backend in ("cuda", "rocm"):
            return f"{self.backend} {self.accelerator_version}"
        return self.backend  # xpu or cpu

    @property
    def alias_refs(self) -> list[str]:
        """Moving aliases (latest-<vendor>): pushed only after the versioned tags."""
        return [r for r in self.refs if is_alias(r)]

    @property
    def run_flags(self) -> RunFlags:
        return RunFlags.model_validate(self.run)


@dataclass(frozen=True)
class TargetView(Target):
    """A target on one of its platforms (:meth:`Target.on`): what a build, a lock or a run needs."""

    #: The platform this view builds, one of ``platforms``.
    platform: str = field(kw_only=True)

    @property
    def arch(self) -> str:
        """The OCI architecture of this view's platform (amd64, arm64)."""
        return platforms.arch(self.platform)

    @property
    def lock(self) -> str:
        """This platform's hash lock of torch and the target's packages, committed.

        Example:
            >>> project.target("nvidia-cu130").on("linux/arm64").lock
            'images/nvidia-cu130/requirements.arm64.lock'
        """
        return f"images/{self.name}/requirements.{self.arch}.lock"

    @property
    def native(self) -> bool:
        """True when this view's platform is the host's (no emulation)."""
        return self.platform == platforms.host_platform()

    @property
    def unit(self) -> str:
        """How messages name this view: the target, and the platform when it has several."""
        return self.name if len(self.platforms) == 1 else f"{self.name} ({self.platform})"

    @property
    def platform_refs(self) -> list[str]:
        """This platform's own tags (``<tag>-<arch>``) when the target has several platforms, else none.

        Example:
            >>> project.target("nvidia-cu130").on("linux/arm64").platform_refs[0]
            'localhost:5000/ml-runtime:nvidia-cu130-arm64'
        """
        return [platform_tag(r, self.arch) for r in self.refs] if len(self.platforms) > 1 else []

    @property
    def local_refs(self) -> list[str]:
        """The tags this view's image gets in the local engine: the target's own when it is the
        host's platform (or the target's only one), so that ``docker run`` finds the native
        image, and its platform tags."""
        own = self.refs if self.native or len(self.platforms) == 1 else []
        return own + self.platform_refs


@dataclass(frozen=True)
class Project:
    """A loaded, validated and resolved project."""

    root: Path
    matrix_path: Path
    mapping_path: Path
    matrix: Matrix
    mapping: WheelMapping
    #: Platform -> the base reference its builds start FROM (pinned by digest unless --allow-unpinned).
    base_refs: dict[str, str]
    targets: list[Target] = field(default_factory=list)

    def base_for(self, platform: str) -> str:
        """The base reference *platform*'s builds start FROM."""
        return self.base_refs[platform]

    @property
    def images_dir(self) -> Path:
        return self.root / "images"

    @property
    def templates_dir(self) -> Path:
        return self.root / "templates"

    @property
    def base_repository(self) -> str:
        return base_repository(self.matrix.registry)

    @property
    def glibc(self) -> tuple[int, int]:
        return SUITE_GLIBC[self.matrix.base.debian_suite]

    def target(self, name: str) -> Target:
        for t in self.targets:
            if t.name == name:
                return t
        raise UserError(f"--target: unknown target {name!r} (known: {', '.join(t.name for t in self.targets)})")

    def select(self, names: tuple[str, ...] | list[str], group: str = "default") -> list[Target]:
        """Targets named on the command line (a group name expands), else the group's."""
        if not names:
            names = self.matrix.group(group)
        picked: list[Target] = []
        for name in names:
            members = self.matrix.group(name) if name in self.matrix.groups else [name]
            for member in members:
                t = self.target(member)
                if t not in picked:
                    picked.append(t)
        return picked

    def views(self, names: tuple[str, ...] | list[str], only: Sequence[str] = (),
              group: str = "default") -> list[TargetView]:
        """The selected targets (see :meth:`select`), one view per platform (those in *only*, when given).

        Example:
            >>> [t.unit for t in project.views(["nvidia-cu130"])]
            ['nvidia-cu130 (linux/amd64)', 'nvidia-cu130 (linux/arm64)']
        """
        out = []
        for target in self.select(names, group):
            picked = target.views(only)
            if not picked:
                raise UserError(f"--platform: target {target.name} is built for {', '.join(target.platforms)}, not "
                                f"{', '.join(only)}; add the platform to its platforms in matrix.yaml")
            out += picked
        return out


def _alias_owner(matrix: Matrix) -> dict[str, str]:
    """latest-<vendor> goes to the vendor's target with the newest torch, then accelerator
    version; on a tie, to the one listed first."""
    best: dict[str, tuple[tuple[Version, Version], str]] = {}
    for t in matrix.targets:
        vendor = BACKEND_VENDOR[t.backend]
        key = (Version(t.torch), Version(t.version or "0"))
        if vendor not in best or key > best[vendor][0]:
            best[vendor] = (key, t.name)
    return {vendor: name for vendor, (_, name) in best.items()}


def _resolve(matrix: Matrix, mapping: WheelMapping, mfile: str, overrides: dict[str, str]) -> list[Target]:
    """Every target resolved, or a UserError with the problems of all of them."""
    problems: list[str] = []
    alias = _alias_owner(matrix)
    host = platforms.host_platform()
    targets: list[Target] = []
    owner_of_tag: dict[str, str] = {}
    for i, t in enumerate(matrix.targets):
        where = f"{mfile}: targets[{i}]"
        found = _entry(mapping, t, where)
        if isinstance(found, str):
            problems.append(found)
            continue
        key, entry = found
        vendor = BACKEND_VENDOR[t.backend]
        tags, own_problems = _tags(t, vendor, alias.get(vendor) == t.name, where)
        problems += own_problems + _label_problems(t, where) + _claim_tags(tags, t.name, owner_of_tag, where)
        try:
            index = index_for(key, entry, overrides)
        except ValueError as exc:
            problems.append(f"index override for {key}: {exc}")
            continue
        targets.append(_resolved(matrix, mapping, t, key, entry, tags, index, host))
    if problems:
        raise UserError(*problems)
    return targets


def _entry(mapping: WheelMapping, t: TargetSpec, where: str) -> tuple[str, Entry] | str:
    """The wheel mapping's (key, entry) for the target, or the problem why there is none."""
    found = mapping.find(t.backend, t.version)
    if found is None:
        known = sorted(str(e.version) for e in mapping.entries.values() if e.backend == t.backend)
        return (f"{where}.version: no wheel-mapping.json entry for backend {t.backend!r} version {t.version!r} "
                f"(known {t.backend} versions: {', '.join(known) or 'none'})")
    key, entry = found
    if Version(t.torch) not in SpecifierSet(entry.torch):
        return (f"{where}.torch: torch {t.torch} is not published for {key} "
                f"(wheel-mapping.json entries.{key}.torch: {entry.torch})")
    return found


def _tags(t: TargetSpec, vendor: str, latest: bool, where: str) -> tuple[list[str], list[str]]:
    """The target's tags (the generated ones, then its own), and the problems of its own: one generated
    anyway (the entry would be ignored)."""
    made = generated(t.name, t.torch, vendor, latest=latest)
    problems = [f"{where}.tags: {x!r} is a generated tag of this target already; remove it"
                for x in t.tags if x in made]
    return made + [x for x in t.tags if x not in made], problems


def _label_problems(t: TargetSpec, where: str) -> list[str]:
    """The target's labels that are the builder's own."""
    return [f"{where}.labels.{label}: the builder sets this label itself (it would be "
            f"overridden or would falsify the image's record); use a key of your own"
            for label in t.labels if label in BUILDER_LABELS or label.startswith(LABEL_PREFIX + ".")]


def _claim_tags(tags: list[str], name: str, owner_of_tag: dict[str, str], where: str) -> list[str]:
    """Records *tags* as target *name*'s in *owner_of_tag*; returns those invalid or another target's."""
    problems = []
    for tag in tags:
        if not g.TAG.fullmatch(tag):
            problems.append(f"{where}.name: generated tag {tag!r} is not a valid Docker tag; shorten the name")
        elif tag in owner_of_tag:
            problems.append(f"{where}.tags: tag {tag!r} is also a tag of target {owner_of_tag[tag]!r}")
        owner_of_tag.setdefault(tag, name)
    return problems


def _resolved(matrix: Matrix, mapping: WheelMapping, t: TargetSpec, key: str, entry: Entry, tags: list[str],
              index: str, host: str) -> Target:
    """The target with every value worked out."""
    vendor = BACKEND_VENDOR[t.backend]
    facts = mapping.vendors[vendor]
    pin = f"{t.torch}{entry.local_version}"
    dist = distributed_backend(entry, t.torch)
    listed = t.platforms or matrix.platforms or [host]
    labels = {
        "org.opencontainers.image.title": f"ml-runtime {t.name}",
        "org.opencontainers.image.version": f"{t.name}-torch{t.torch}",
        **({"org.opencontainers.image.source": public(matrix.source)} if matrix.source else {}),
        f"{LABEL_PREFIX}.target": t.name,
        f"{LABEL_PREFIX}.backend": t.backend,
        f"{LABEL_PREFIX}.vendor": vendor,
        f"{LABEL_PREFIX}.accelerator-version": t.version or "none",
        f"{LABEL_PREFIX}.torch": pin,
        f"{LABEL_PREFIX}.distributed": dist,
        **t.labels,
    }
    return Target(
        name=t.name,
        backend=t.backend,
        vendor=vendor,
        accelerator_version=t.version,
        torch=t.torch,
        torch_pin=pin,
        entry=key,
        index_url=index,
        packages=[*matrix.torch_packages, *entry.packages, *t.packages],
        distributed=dist,
        tags=tags,
        refs=[f"{matrix.registry}:{tag}" for tag in tags],
        labels=labels,
        env=dict(facts.env),
        run=facts.run.model_dump(),
        visible_devices_env=facts.visible_devices_env,
        dockerfile=f"images/{t.name}/Dockerfile",
        platforms=list(listed),
        layers=[*(layer.name for layer in matrix.layers if layer.applies_to(t.backend)), PACKAGES_LAYER],
        k8s_resource=t.k8s_resource,
        compression=t.compression or matrix.compression,
    )


def spec_hash(matrix: Matrix) -> str:
    """Hash of the base's bootstrap spec: a lock made from another spec is stale."""
    spec = matrix.base.bootstrap.model_dump() if matrix.base.bootstrap else {"image": matrix.base.image}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def pinned_base_refs(root: Path, matrix: Matrix, platforms_used: Sequence[str], allow_unpinned: bool,
                     mfile: str) -> dict[str, str]:
    """{platform: the base reference its targets build FROM}: the image pinned by digest, or base.lock.json's pins.

    With ``allow_unpinned``, a platform the lock lacks gets the floating tag ``<registry>/base:<suite>-<arch>``.
    """
    base = matrix.base
    if base.image is not None:  # one reference for every platform: a multi-arch index resolves per platform
        if g.PINNED_IMAGE.fullmatch(base.image) or allow_unpinned:
            return {p: base.image for p in platforms_used}
        raise UserError(
            f"{mfile}: base.image: {base.image!r} is not pinned by digest; write name@sha256:<64 hex> "
            "(docker inspect --format '{{index .RepoDigests 0}}' NAME) or pass --allow-unpinned"
        )
    lock = read_base_lock(root)
    if lock is not None and lock.spec_sha256 != spec_hash(matrix) and not allow_unpinned:
        raise UserError(
            f"{LOCK_NAME}: made from another base.bootstrap spec than {mfile}'s; "
            "run 'builder base --update' to rebuild and re-pin the base"
        )
    refs = {}
    for platform in platforms_used:
        pinned = lock.platforms.get(platform) if lock is not None else None
        if pinned is None:
            if allow_unpinned:
                refs[platform] = base_tag(matrix.registry, base.debian_suite, platforms.arch(platform))
                continue
            what = "missing" if lock is None else f"pins no base for {platform}"
            raise UserError(
                f"{LOCK_NAME}: {what}; run 'builder base --platform {platform}' to bootstrap, push and pin it "
                "(or pass --allow-unpinned to render against a floating tag)"
            )
        if not pinned.reference.startswith(f"{base_repository(matrix.registry)}@"):
            if allow_unpinned:  # builder base re-pins it in the new registry
                refs[platform] = base_tag(matrix.registry, base.debian_suite, platforms.arch(platform))
                continue
            raise UserError(
                f"{LOCK_NAME}: platforms.{platform}.reference {pinned.reference!r} is not in registry "
                f"{matrix.registry}/base; run 'builder base --update' after changing the registry"
            )
        refs[platform] = pinned.reference
    return refs


def load_project(
    matrix_path: Path | str = "matrix.yaml",
    mapping_path: Path | str | None = None,
    *,
    allow_unpinned: bool = False,
    index_overrides: dict[str, str] | None = None,
) -> Project:
    """Load, validate and resolve a project; every user error is a ``UserError``.

    Example:
        >>> project = load_project("matrix.yaml")
        >>> project.target("cpu").torch_pin
        '2.13.0+cpu'
    """
    matrix_path = Path(matrix_path).resolve()
    root = matrix_path.parent
    mapping_path = Path(mapping_path).resolve() if mapping_path else root / "wheel-mapping.json"
    problems: list[str] = []
    matrix = mapping = None
    try:
        matrix = Matrix.model_validate(_mapping_doc(matrix_path))
    except ValidationError as exc:
        problems += format_errors(matrix_path, Matrix, exc)
    try:
        mapping = WheelMapping.model_validate(load_json(mapping_path))
    except ValidationError as exc:
        problems += format_errors(mapping_path, WheelMapping, exc)
    except UserError as exc:
        problems += exc.lines
    if problems or matrix is None or mapping is None:
        raise UserError(*problems)
    unknown = sorted(set(index_overrides or {}) - set(mapping.entries))
    if unknown:
        raise UserError(f"--index: unknown entry {', '.join(unknown)} (known: {', '.join(mapping.entries)})")
    targets = _resolve(matrix, mapping, matrix_path.name, index_overrides or {})
    used = list(dict.fromkeys(p for t in targets for p in t.platforms))
    base_refs = pinned_base_refs(root, matrix, used, allow_unpinned, matrix_path.name)
    return Project(root, matrix_path, mapping_path, matrix, mapping, base_refs, targets)


def _mapping_doc(path: Path) -> Any:
    if not path.exists():
        raise UserError(f"{path}: file not found; run from the project folder or pass --matrix PATH")
    data = load_yaml(path)
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise UserError(f"{path.name}: the top level must be a mapping (registry, base, python, targets, ...), not {kind}")
    return data
