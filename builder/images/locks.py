"""``builder lock``: each target's wheels resolved on the host into the wheelhouse, with hash locks.

pip runs on the host (:mod:`builder.images.resolve`), resolving for the image's Python and
platform, into the shared wheelhouse (:mod:`builder.images.wheelhouse`). Three locks result
(format: :mod:`builder.images.lockfile`), per platform (``<arch>``: amd64, arm64):
``images/tools.<arch>.lock`` (the build-time installer), ``images/common.<arch>.lock`` (the
shared layer) and ``images/<target>/requirements.<arch>.lock`` (torch and friends, pinned to
agree with common).
A lock whose recorded inputs are unchanged and whose wheels are present is reused as is:
a no-op rebuild never re-resolves.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.config import platforms
from builder.config.errors import TargetFailed, UserError
from builder.config.matrix import requirement_name
from builder.config.project import Project, ResolvedTarget
from builder.config.urls import public, redact
from builder.config.wheelmap import index_env_var
from builder.images.lockfile import Pin, ordered, read_lock, write_lock
from builder.images.resolve import fetch_locked, index_reachable, resolve
from builder.images.wheelhouse import missing as missing_wheels


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
        missing = missing_wheels(pins) if fetch else []
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

def tools_lock(project: Project, platform: str, fetch: bool = True) -> list[Pin]:
    """images/tools.<arch>.lock: the installer used during builds (never left in an image)."""
    m = project.matrix
    fp = _fingerprint("tools", m.installer, m.python, project.glibc, platforms.machine(platform))
    return _ensure(project, platform, shared_lock_path(project, "tools", platform), "the build-time installer", fp,
                   lambda: resolve(project, [m.installer], platform), fetch=fetch)

def common_lock(project: Project, platform: str, fetch: bool = True) -> list[Pin]:
    """images/common.<arch>.lock: the backend-independent layer shared by every target."""
    m = project.matrix
    fp = _fingerprint("common", sorted(m.common_packages), m.python, project.glibc, platforms.machine(platform))
    return _ensure(project, platform, shared_lock_path(project, "common", platform),
                   "the shared layer of every target", fp,
                   lambda: resolve(project, list(m.common_packages), platform), fetch=fetch)

def _requirements(target: ResolvedTarget) -> list[str]:
    return [f"torch=={target.torch_pin}", *target.packages]

def _target_fingerprint(project: Project, target: ResolvedTarget, common: list[Pin]) -> str:
    # In lock order: just resolved (pip's order) or read back, the same common pins give the same hash.
    common_hash = _fingerprint([p.line() for p in ordered(common)])
    return _fingerprint("target", target.entry, _requirements(target), project.matrix.python, project.glibc,
                        platforms.machine(target.platform), common_hash)

def sibling_pins(project: Project, target: ResolvedTarget, common: list[Pin]) -> list[Pin]:
    """The pins of the other targets' current locks for this view's platform, torch and index: the
    versions a new lock prefers, so that a target added later (cpu plus one package) gets the torch
    layers' wheels its siblings locked, and shares those layers, even after the index has moved on.

    A name two siblings pin differently takes the first in matrix order. Not part of the lock's
    fingerprint: a sibling's relock leaves this lock current (it is a preference, not an input).
    """
    found: list[Pin] = []
    for other in project.targets:
        if other.name == target.name or target.platform not in other.platforms:
            continue
        view = other.on(target.platform)
        if (view.torch_pin, view.entry, view.index_url) != (target.torch_pin, target.entry, target.index_url):
            continue
        recorded, pins = read_lock(project.root / view.lock)
        if recorded == _target_fingerprint(project, view, common):  # else stale or missing: other inputs
            found += pins
    return first_by_name(found)


def first_by_name(pins: list[Pin]) -> list[Pin]:
    """*pins* with only the first pin of each (canonical) name: the first preference wins."""
    kept: dict[str, Pin] = {}
    for pin in pins:
        kept.setdefault(canonicalize_name(pin.name), pin)
    return list(kept.values())


def previous_pins(project: Project, target: ResolvedTarget) -> list[Pin]:
    """The pins of this view's own lock as it stands, stale or not, minus the names the target asks
    for itself (``torch==X``, its ``packages:``): what a relock prefers, so that a package added to a
    CUDA target keeps the accelerate (and every other) wheel it had, and re-pushes its layer alone,
    even after the index has moved on. A name the target asks for takes the new requirement.
    """
    asked = {requirement_name(r) for r in _requirements(target)}
    _, pins = read_lock(project.root / target.lock)
    return [p for p in pins if canonicalize_name(p.name) not in asked]


def target_lock(project: Project, target: ResolvedTarget, common: list[Pin], fetch: bool = True) -> list[Pin]:
    """images/<target>/requirements.<arch>.lock: torch and the target's packages, minus the common layer.

    Resolved with the lock's own previous pins (:func:`previous_pins`) and then the siblings'
    (:func:`sibling_pins`) as constraints; when the target's own packages need other versions,
    with the siblings' alone, then with only the common layer's.
    """
    path = project.root / target.lock
    requirements = _requirements(target)
    fp = _target_fingerprint(project, target, common)

    def resolver() -> list[Pin]:
        unreachable = index_reachable(target.index_url)

        def attempt(constraints: list[Pin]) -> list[Pin]:
            return resolve(project, requirements, target.platform,
                           vendor_index=None if unreachable else target.index_url, constraints=constraints)

        siblings = sibling_pins(project, target, common)
        both = first_by_name([*previous_pins(project, target), *siblings])
        pins: list[Pin] = []
        for preferred in filter(None, [both] if both == siblings else [both, siblings]):
            with contextlib.suppress(TargetFailed):  # else the target's packages need other versions
                pins = attempt([*common, *preferred])
                break
        try:
            pins = pins or attempt(common)
        except TargetFailed as exc:
            where = f"the index {public(target.index_url)} ({target.entry})"
            how = f"point it at a mirror with {index_env_var(target.entry)}=URL or --index {target.entry}=URL"
            wheel = (f"torch=={target.torch_pin} for {target.platform} "
                     f"({platforms.machine(target.platform)} manylinux, CPython {project.matrix.python})")
            if unreachable:
                raise TargetFailed(f"{wheel} is not available: {where} is unreachable from "
                                   f"this host ({unreachable}) and pip's own sources lack it; {how}") from None
            if "torch" in str(exc) and ("No matching distribution" in str(exc) or "satisfies" in str(exc)):
                raise TargetFailed(f"no wheel of {wheel} exists on {where} or pip's own sources: {redact(str(exc))}; "
                                   f"remove {target.platform} from the target's platforms, or {how}") from None
            raise TargetFailed(f"resolving {' '.join(requirements)} for {target.platform} from {where} failed: "
                               f"{redact(str(exc))}; {how}") from None
        check_torch_flavour(target, pins)  # before the lock is written
        shared = {canonicalize_name(p.name) for p in common}
        return [p for p in pins if canonicalize_name(p.name) not in shared]

    def index() -> str | None:
        return None if index_reachable(target.index_url) else target.index_url

    pins = _ensure(project, target.platform, path, f"target {target.unit}", fp, resolver, index, fetch=fetch)
    check_torch_flavour(target, pins)  # a reused lock, too
    return pins

def check_torch_flavour(target: ResolvedTarget, pins: list[Pin]) -> None:
    """The locked torch must be the target's build: ``==2.13.0`` also matches ``2.13.0+cpu``, which
    PEP 440 ranks above the bare version, so a +cpu wheel among pip's sources wins on a cuda target."""
    expected = Version(target.torch_pin)
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
        f"target {target.unit}: {found}, expected {target.torch_pin} ({want}); fix: remove that wheel or "
        f"its source from pip's configuration (`pip config list`: find-links, extra-index-url) so "
        f"{public(target.index_url)} supplies torch, delete {target.lock} if it holds the wrong torch, and run "
        f"`builder lock -t {target.name} --platform {target.platform}`"
    )

def lock_all(
    project: Project, targets: list[ResolvedTarget], say: Callable[[str], object], fetch: bool = True
) -> dict[str, str]:
    """Lock tools, common and every target view, per platform; return {view's unit: error} for those that failed.

    ``fetch=False``: current locks are taken as they are, their wheels not fetched or checked.
    """
    common: dict[str, list[Pin]] = {}
    for platform in dict.fromkeys(t.platform for t in targets):
        try:
            tools_lock(project, platform, fetch)
            common[platform] = common_lock(project, platform, fetch)
        except TargetFailed as exc:
            raise UserError(f"resolving the shared packages for {platform} failed: {exc}") from None
    failed = {}
    for target in targets:
        try:
            pins = target_lock(project, target, common[target.platform], fetch)
            say(f"{target.unit}: {len(pins)} wheels locked in {target.lock}")
        except TargetFailed as exc:
            failed[target.unit] = str(exc)
    return failed
