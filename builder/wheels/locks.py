"""``builder lock``: each target's wheels resolved on the host into the wheelhouse, with hash locks.

pip runs on the host (:mod:`builder.wheels.resolve`), resolving for the image's Python and
platform, into the shared wheelhouse (:mod:`builder.wheels.wheelhouse`). Three locks result
(format: :mod:`builder.wheels.lockfile`), per platform (``<arch>``: amd64, arm64):
``images/tools.<arch>.lock`` (the build-time installer), ``images/common.<arch>.lock`` (the
shared layer) and ``images/<target>/requirements.<arch>.lock`` (torch and friends, pinned to
agree with common).
A lock whose recorded inputs are unchanged and whose wheels are present is reused as is:
a no-op rebuild never re-resolves. A lock whose inputs changed is re-resolved preferring the
versions it pinned (a target's also its siblings'), as pip-tools and uv keep an output file's
pins: only what the change forces moves, and each pin that moves is said in one line, with why.
"""

from __future__ import annotations

import contextlib
import email.parser
import hashlib
import json
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.config import platforms
from builder.config.errors import TargetFailed, UserError
from builder.config.ownership import clone_id
from builder.config.project import Project, Target, TargetView
from builder.config.urls import public, redact
from builder.config.wheelmap import index_env_var
from builder.wheels.lockfile import Pin, ordered, read_lock, write_lock
from builder.wheels.resolve import fetch_locked, index_reachable, resolve
from builder.wheels.wheelhouse import location as wheelhouse_location
from builder.wheels.wheelhouse import missing as missing_wheels

Say = Callable[[str], object]


def _fingerprint(*parts: object) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()

def _ensure(project: Project, platform: str, path: Path, what: str, fingerprint: str,
            resolver: Callable[[], list[Pin]], index: Callable[[], str | None] = lambda: None,
            fetch: bool = True) -> list[Pin]:
    """Reuse the lock when its inputs are unchanged and its wheels are here, intact; else resolve.

    ``fetch=False`` trusts a current lock without its wheels (deciding whether to build at all).
    """
    recorded, pins = read_lock(path)
    if recorded == fingerprint and pins:
        missing = missing_wheels(pins, clone_id(project.root)) if fetch else []
        if missing:
            # Locked but not downloaded (fresh clone, new runner) or damaged: fetch exactly the locked files.
            fetch_locked(project, missing, path, index(), platform)
        return pins
    pins = resolver()
    write_lock(path, what, fingerprint, pins)
    return pins

def shared_lock_path(project: Project, name: str, platform: str) -> Path:
    """images/<name>.<arch>.lock: a lock every target of the platform shares (tools, common)."""
    return project.images_dir / f"{name}.{platforms.arch(platform)}.lock"

def _relock(project: Project, platform: str, path: Path, requirements: list[str], preferred: list[Pin],
            say: Say, *, vendor_index: str | None = None, constraints: Sequence[Pin] = ()) -> list[Pin]:
    """Resolve *requirements* preferring the versions *preferred* pins; say each preferred pin that
    moved, from what to what and why (``<lock>: accelerate 1.15.0 -> 1.16.0: rich 14.0 needs
    accelerate>=1.16``)."""
    pins = resolve(project, requirements, platform, vendor_index=vendor_index, constraints=constraints,
                   preferences=preferred)
    before = {canonicalize_name(p.name): p.version for p in preferred}
    where = path.relative_to(project.root) if path.is_relative_to(project.root) else path
    for pin in ordered(pins):
        old = before.get(canonicalize_name(pin.name))
        if old is not None and old != pin.version:
            why = why_moved(project, platform, pin.name, old, requirements, pins)
            say(f"{where}: {pin.name} {old} -> {pin.version}: {why}")
    return pins

def why_moved(project: Project, platform: str, name: str, old: str, requirements: list[str],
              pins: list[Pin]) -> str:
    """Why the resolution *pins* does not keep *name* at *old*: a requirement of matrix.yaml's, else
    one of a resolved wheel's (its METADATA in the wheelhouse), whose specifier excludes *old*."""
    unknown = (f"no resolution keeps {old} (it left the index, has no wheel for this Python and platform, "
               "or conflicts through other packages)")
    try:
        version = Version(old)
    except InvalidVersion:
        return unknown
    env = {**{k: str(v) for k, v in default_environment().items()}, "python_version": project.matrix.python,
           "python_full_version": f"{project.matrix.python}.0", "platform_machine": platforms.machine(platform),
           "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "extra": ""}

    def excludes(req: Requirement) -> bool:
        return (canonicalize_name(req.name) == canonicalize_name(name)
                and not req.specifier.contains(version, prereleases=True)
                and (req.marker is None or req.marker.evaluate(env)))

    for line in requirements:
        with contextlib.suppress(InvalidRequirement):
            if excludes(Requirement(line)):
                return f"matrix.yaml asks {line}"
    for pin in pins:
        for req in _requires(wheelhouse_location() / pin.filename):
            if excludes(req):
                return f"{pin.name} {pin.version} needs {req.name}{req.specifier}"
    return unknown

def _requires(wheel: Path) -> list[Requirement]:
    """The Requires-Dist of a wheel (its METADATA), [] when it can't be read."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            name = next(n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
            text = archive.read(name).decode("utf-8", "replace")
    except (OSError, zipfile.BadZipFile, StopIteration):
        return []
    found = []
    for line in email.parser.Parser().parsestr(text, headersonly=True).get_all("Requires-Dist") or []:
        with contextlib.suppress(InvalidRequirement):
            found.append(Requirement(line))
    return found

def tools_lock(project: Project, platform: str, fetch: bool = True, say: Say = lambda _line: None) -> list[Pin]:
    """images/tools.<arch>.lock: the installer used during builds (never left in an image)."""
    m = project.matrix
    path = shared_lock_path(project, "tools", platform)
    fp = _fingerprint("tools", m.installer, m.python, project.glibc, platforms.machine(platform))
    return _ensure(project, platform, path, "the build-time installer", fp,
                   lambda: _relock(project, platform, path, [m.installer], read_lock(path)[1], say), fetch=fetch)

def common_lock(project: Project, platform: str, fetch: bool = True, say: Say = lambda _line: None) -> list[Pin]:
    """images/common.<arch>.lock: the backend-independent layer shared by every target."""
    m = project.matrix
    path = shared_lock_path(project, "common", platform)
    fp = _fingerprint("common", sorted(m.common_packages), m.python, project.glibc, platforms.machine(platform))
    return _ensure(project, platform, path, "the shared layer of every target", fp,
                   lambda: _relock(project, platform, path, list(m.common_packages), read_lock(path)[1], say),
                   fetch=fetch)

def _requirements(target: Target) -> list[str]:
    return [f"torch=={target.torch_pin}", *target.packages]

def _target_fingerprint(project: Project, view: TargetView, common: list[Pin]) -> str:
    # In lock order: just resolved (pip's order) or read back, the same common pins give the same hash.
    common_hash = _fingerprint([p.line() for p in ordered(common)])
    return _fingerprint("target", view.entry, _requirements(view), project.matrix.python, project.glibc,
                        platforms.machine(view.platform), common_hash)

def sibling_pins(project: Project, view: TargetView, common: list[Pin]) -> list[Pin]:
    """The pins of the other targets' current locks for this view's platform, torch and index: the
    versions a new lock prefers, so that a target added later (cpu plus one package) gets the torch
    layers' wheels its siblings locked, and shares those layers, even after the index has moved on.

    A name two siblings pin differently takes the first in matrix order. Not part of the lock's
    fingerprint: a sibling's relock leaves this lock current (it is a preference, not an input).
    """
    found: list[Pin] = []
    for other in project.targets:
        if other.name == view.name or view.platform not in other.platforms:
            continue
        sibling = other.on(view.platform)
        if (sibling.torch_pin, sibling.entry, sibling.index_url) != (view.torch_pin, view.entry, view.index_url):
            continue
        recorded, pins = read_lock(project.root / sibling.lock)
        if recorded == _target_fingerprint(project, sibling, common):  # else stale or missing: other inputs
            found += pins
    return first_by_name(found)


def first_by_name(pins: list[Pin]) -> list[Pin]:
    """*pins* with only the first pin of each (canonical) name: the first preference wins."""
    kept: dict[str, Pin] = {}
    for pin in pins:
        kept.setdefault(canonicalize_name(pin.name), pin)
    return list(kept.values())


def previous_pins(project: Project, view: TargetView) -> list[Pin]:
    """The pins of this view's own lock as it stands, stale or not: what a relock prefers, so that a
    package added to a target keeps the accelerate (and every other) wheel it had, and re-pushes its
    layer alone, even after the index has moved on. A preference only: a version the target's new
    requirements exclude (``torch==X``, a ``packages:`` specifier) is not kept.
    """
    return read_lock(project.root / view.lock)[1]


def target_lock(project: Project, view: TargetView, common: list[Pin], fetch: bool = True,
                say: Say = lambda _line: None) -> list[Pin]:
    """images/<target>/requirements.<arch>.lock: torch and the target's packages, minus the common layer.

    Resolved with the common layer's pins as constraints, preferring the lock's own previous pins
    (:func:`previous_pins`), then the siblings' (:func:`sibling_pins`): uv moves only what the
    target's new requirements force.
    """
    path = project.root / view.lock
    requirements = _requirements(view)
    fp = _target_fingerprint(project, view, common)

    def resolver() -> list[Pin]:
        unreachable = index_reachable(view.index_url)
        shared = {canonicalize_name(p.name) for p in common}
        preferred = [p for p in first_by_name([*previous_pins(project, view), *sibling_pins(project, view, common)])
                     if canonicalize_name(p.name) not in shared]  # the common lock says its own moves
        try:
            pins = _relock(project, view.platform, path, requirements, preferred, say,
                           vendor_index=None if unreachable else view.index_url, constraints=common)
        except TargetFailed as exc:
            where = f"the index {public(view.index_url)} ({view.entry})"
            how = f"point it at a mirror with {index_env_var(view.entry)}=URL or --index {view.entry}=URL"
            wheel = (f"torch=={view.torch_pin} for {view.platform} "
                     f"({platforms.machine(view.platform)} manylinux, CPython {project.matrix.python})")
            if unreachable:
                raise TargetFailed(f"{wheel} is not available: {where} is unreachable from "
                                   f"this host ({unreachable}) and pip's own sources lack it; {how}") from None
            if "torch" in str(exc) and ("No matching distribution" in str(exc) or "satisfies" in str(exc)):
                raise TargetFailed(f"no wheel of {wheel} exists on {where} or pip's own sources: {redact(str(exc))}; "
                                   f"remove {view.platform} from the target's platforms, or {how}") from None
            raise TargetFailed(f"resolving {' '.join(requirements)} for {view.platform} from {where} failed: "
                               f"{redact(str(exc))}; {how}") from None
        check_torch_flavour(view, pins)  # before the lock is written
        return [p for p in pins if canonicalize_name(p.name) not in shared]

    def index() -> str | None:
        return None if index_reachable(view.index_url) else view.index_url

    pins = _ensure(project, view.platform, path, f"target {view.unit}", fp, resolver, index, fetch=fetch)
    check_torch_flavour(view, pins)  # a reused lock, too
    return pins

def check_torch_flavour(view: TargetView, pins: list[Pin]) -> None:
    """The locked torch must be the target's build: ``==2.13.0`` also matches ``2.13.0+cpu``, which
    PEP 440 ranks above the bare version, so a +cpu wheel among pip's sources wins on a cuda target."""
    expected = Version(view.torch_pin)
    torch = next((p for p in pins if canonicalize_name(p.name) == "torch"), None)
    try:
        got = Version(torch.version) if torch else None
    except InvalidVersion:
        got = None
    if got == expected:
        return
    want = f"+{expected.local}" if expected.local else "no local label (PyPI's default build)"
    found = f"resolved torch {torch.version}" if torch else "locked no torch"
    raise TargetFailed(
        f"target {view.unit}: {found}, expected {view.torch_pin} ({want}); fix: remove that wheel or "
        f"its source from pip's configuration (`pip config list`: find-links, extra-index-url) so "
        f"{public(view.index_url)} supplies torch, delete {view.lock} if it holds the wrong torch, and run "
        f"`builder lock -t {view.name} --platform {view.platform}`"
    )

def lock_all(
    project: Project, views: Sequence[TargetView], say: Callable[[str], object], fetch: bool = True
) -> dict[str, str]:
    """Lock tools, common and every target view, per platform; return {view's unit: error} for those that failed.

    ``fetch=False``: current locks are taken as they are, their wheels not fetched or checked.
    A lock line that names a path rather than a wheel (:func:`builder.wheels.lockfile.read_lock`)
    stops it before anything is resolved or fetched.
    """
    for path in dict.fromkeys([*(shared_lock_path(project, name, v.platform) for v in views for name in ("tools", "common")),
                               *(project.root / v.lock for v in views)]):
        read_lock(path)
    common: dict[str, list[Pin]] = {}
    for platform in dict.fromkeys(v.platform for v in views):
        try:
            tools_lock(project, platform, fetch, say)
            common[platform] = common_lock(project, platform, fetch, say)
        except TargetFailed as exc:
            raise UserError(f"resolving the shared packages for {platform} failed: {exc}") from None
    failed = {}
    for view in views:
        try:
            pins = target_lock(project, view, common[view.platform], fetch, say)
            say(f"{view.unit}: {len(pins)} wheels locked in {view.lock}")
        except TargetFailed as exc:
            failed[view.unit] = str(exc)
    return failed
