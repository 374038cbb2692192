"""The SBOM of a target's image: CycloneDX 1.6 JSON from the inputs the build installs, not a scan.

What goes into an image is known exactly before it is built: the hash-locked wheels of
``images/common.<arch>.lock`` and ``images/<target>/requirements.<arch>.lock`` (not
``tools.<arch>.lock``: the installer runs during the build only), the in-image runtime
(``runtime/``, the ``ml-runtime`` distribution) and the base, pinned by digest in
``base.lock.json`` with its Debian packages. Each wheel is listed with its version, its PURL
(``pkg:pypi/...``) and the SHA-256 of the wheel file it was installed from; each Debian package
with ``pkg:deb/debian/<name>@<version>?arch=<arch>&distro=<suite>``; the base as a container
component with its digest. The image itself, once pushed, is the BOM's ``metadata.component``
(its manifest digest as version and SHA-256 hash). The JSON is checked against the CycloneDX 1.6
schema before it is returned.

Example:
    >>> image = "localhost:5000/ml-runtime@sha256:" + "ab" * 32
    >>> doc = json.loads(sbom_json(project, project.target("cpu").default_view, image))
    >>> doc["specVersion"], doc["metadata"]["component"]["version"]
    ('1.6', 'sha256:abab...')
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom, BomMetaData
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.model.tool import ToolRepository
from cyclonedx.output.json import JsonV1Dot6
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from packageurl import PackageURL

from builder.config.baselock import read_base_lock
from builder.config.errors import UserError
from builder.config.project import Project, Target, TargetView
from builder.oci.registry import Ref
from builder.wheels.lockfile import Pin, read_lock
from builder.wheels.locks import shared_lock_path

#: The in-image runtime's source folder (its pyproject.toml names the distribution).
RUNTIME_DIR = "runtime"
PROPERTY = "ml-image-builder"


def builder_version() -> str:
    """The builder's own version (package metadata), or "unknown" when run from an uninstalled tree."""
    try:
        return version("ml-image-builder")
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class Contents:
    """What a target view's image holds, from its inputs."""

    #: (lock path relative to the root, its pins): the locks whose wheels are installed in the image
    locks: list[tuple[str, list[Pin]]]
    #: the in-image runtime distribution: (name, version)
    runtime: tuple[str, str]
    #: the base reference, pinned by digest
    base: str
    #: Debian package -> version in the base (empty when the base is not bootstrapped here)
    debs: dict[str, str] = field(default_factory=dict)
    suite: str = ""

    @property
    def wheels(self) -> list[Pin]:
        return [p for _, pins in self.locks for p in pins]


def contents(project: Project, view: TargetView) -> Contents:
    """The inputs installed into *view*'s image, read from its platform's committed locks.

    Example:
        >>> [path for path, _ in contents(project, project.target("cpu").default_view).locks]
        ['images/common.amd64.lock', 'images/cpu/requirements.amd64.lock']
    """
    locks = []
    for path in (shared_lock_path(project, "common", view.platform), project.root / view.lock):
        _, pins = read_lock(path)
        rel = str(path.relative_to(project.root))
        if not pins:
            raise UserError(f"{rel} is missing or empty: run 'builder lock -t {view.name} --platform "
                            f"{view.platform}' before making the SBOM of {view.unit}")
        locks.append((rel, pins))
    runtime_toml = project.root / RUNTIME_DIR / "pyproject.toml"
    try:
        meta = tomllib.loads(runtime_toml.read_text(encoding="utf-8"))["project"]
        runtime = (str(meta["name"]), str(meta["version"]))
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"{runtime_toml}: cannot read the runtime's name and version ({exc})") from None
    base = project.base_for(view.platform)
    lock = read_base_lock(project.root)
    pinned = lock.platforms.get(view.platform) if lock else None
    debs = dict(pinned.packages) if pinned and pinned.reference == base else {}
    return Contents(locks, runtime, base, debs, project.matrix.base.debian_suite)


def _sha256(hexdigest: str) -> HashType:
    return HashType(alg=HashAlgorithm.SHA_256, content=hexdigest)


def _oci_purl(ref: str, digest: str) -> PackageURL:
    r = Ref.parse(ref)
    return PackageURL(type="oci", name=r.repository.rsplit("/", 1)[-1], version=digest,
                      qualifiers={"repository_url": r.name})


def make_bom(project: Project, view: TargetView, image: str | None = None) -> Bom:
    """The CycloneDX BOM of *view*'s image; *image* (``host/repo@sha256:...``) names the pushed image.

    Example:
        >>> len(make_bom(project, project.target("cpu").default_view).components) > 100
        True
    """
    c = contents(project, view)
    arch = view.arch
    components: list[Component] = []
    for lock, pins in c.locks:
        for pin in pins:
            components.append(Component(
                type=ComponentType.LIBRARY, name=pin.name, version=pin.version, bom_ref=f"pypi:{pin.name}",
                purl=PackageURL(type="pypi", name=pin.name, version=pin.version), hashes=[_sha256(pin.sha256)],
                properties=[Property(name=f"{PROPERTY}:wheel", value=pin.filename),
                            Property(name=f"{PROPERTY}:lock", value=lock)],
            ))
    name, runtime_version = c.runtime
    components.append(Component(
        type=ComponentType.LIBRARY, name=name, version=runtime_version, bom_ref=f"pypi:{name}",
        purl=PackageURL(type="pypi", name=name, version=runtime_version),
        properties=[Property(name=f"{PROPERTY}:source", value=f"{RUNTIME_DIR}/ (built into the image)")],
    ))
    base = Ref.parse(c.base)
    base_digest = base.digest or ""
    components.append(Component(
        type=ComponentType.CONTAINER, name=base.name, version=base_digest or base.tag, bom_ref="base",
        purl=_oci_purl(c.base, base_digest) if base_digest else None,
        hashes=[_sha256(base_digest.removeprefix("sha256:"))] if base_digest else None,
        description="the shared base image every target starts FROM",
    ))
    for deb, deb_version in sorted(c.debs.items()):
        components.append(Component(
            type=ComponentType.LIBRARY, name=deb, version=deb_version, bom_ref=f"deb:{deb}",
            purl=PackageURL(type="deb", namespace="debian", name=deb, version=deb_version,
                            qualifiers={"arch": arch, "distro": c.suite}),
        ))
    properties = [Property(name=f"{PROPERTY}:target", value=view.name),
                  Property(name=f"{PROPERTY}:platform", value=view.platform)]
    if not c.debs:
        properties.append(Property(name=f"{PROPERTY}:debian-packages",
                                   value="unknown: base.lock.json does not record this base's packages"))
    subject = _image_component(view, image)
    tool = Component(type=ComponentType.APPLICATION, name="ml-image-builder", version=builder_version())
    metadata = BomMetaData(component=subject, properties=properties, tools=ToolRepository(components=[tool]))
    bom = Bom(components=components, metadata=metadata)
    # The image holds the base and the wheels; the base holds its Debian packages.
    by_ref = {str(comp.bom_ref): comp for comp in components}
    bom.register_dependency(subject, [comp for comp in components if not str(comp.bom_ref).startswith("deb:")])
    bom.register_dependency(by_ref["base"], [comp for comp in components if str(comp.bom_ref).startswith("deb:")])
    return bom


def _image_component(target: Target, image: str | None) -> Component:
    if image is None:
        return Component(type=ComponentType.CONTAINER, name=Ref.parse(target.primary_ref).name,
                         version=target.primary_ref.rsplit(":", 1)[-1], bom_ref="image")
    r = Ref.parse(image)
    if not r.digest:
        raise UserError(f"the SBOM's image {image} names no digest (host/repo@sha256:...)")
    return Component(type=ComponentType.CONTAINER, name=r.name, version=r.digest, bom_ref="image",
                     purl=_oci_purl(image, r.digest), hashes=[_sha256(r.digest.removeprefix("sha256:"))])


def to_json(bom: Bom) -> str:
    """The BOM as CycloneDX 1.6 JSON, validated against the schema (a failure is a bug: it raises)."""
    text = JsonV1Dot6(bom).output_as_string(indent=2)
    problem = validate(text)
    if problem:
        raise RuntimeError(f"the SBOM fails the CycloneDX 1.6 schema: {problem}")
    return text


def validate(text: str) -> str | None:
    """None when *text* is valid CycloneDX 1.6 JSON, else the first problem, in a line."""
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    return None if error is None else str(error).splitlines()[0][:300]


def sbom_json(project: Project, view: TargetView, image: str | None = None) -> str:
    """The validated CycloneDX 1.6 JSON of *view*'s image (see :func:`make_bom`)."""
    return to_json(make_bom(project, view, image))


def packages(doc: dict[str, Any]) -> dict[str, dict[str, str]]:
    """{"pypi": {name: version}, "deb": {name: version}} of a CycloneDX document, by PURL type.

    Example:
        >>> packages(json.loads(sbom_json(project, project.target("cpu").default_view)))["pypi"]["torch"]
        '2.13.0+cpu'
    """
    out: dict[str, dict[str, str]] = {"pypi": {}, "deb": {}}
    for comp in doc.get("components", []):
        purl = comp.get("purl")
        if not purl:
            continue
        p = PackageURL.from_string(purl)
        if p.type in out and p.version is not None:
            out[p.type][p.name] = p.version
    return out
