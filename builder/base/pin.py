"""Getting the shared base every target starts from, per platform: :func:`get` is the one way
(``builder base``, ``builder build`` before planning and before each build); ``builder base --check``
is :func:`check`.

With ``bootstrap:``, the base is made (:mod:`builder.base.bootstrap`) and pushed from its own bytes
(:mod:`builder.base.blobs`); with ``image:``, the pinned reference is pulled. The registry digest
goes into base.lock.json.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from builder.base.blobs import base_tag, copy_base, gzip_layer, hold, make_image, push_base, saved_blobs
from builder.base.bootstrap import Rootfs, drift_report, image_config, image_id_of, recipe_hash
from builder.config.baselock import BaseLock, PinnedBase, read_base_lock, write_base_lock
from builder.config.errors import UserError
from builder.config.heartbeat import heartbeat
from builder.config.project import Project, pinned_base_refs, spec_hash
from builder.config.tags import tag_of
from builder.oci.engine import Engine, EngineError
from builder.oci.localregistry import ensure_local
from builder.oci.registry import RegistryFault, credentials, manifest_digest
from builder.oci.registry import ping as registry_answers

#: What a caller needs of a platform's base (:func:`get`).
Need = Literal["pinned", "local", "published"]


def local(engine: Engine, ref: str) -> bool:
    """Whether the engine holds the base *ref* (``repo@sha256:...``, or an ``image:``'s reference): the one
    test of "local" (both image stores find an image by the reference it was pulled or pushed as)."""
    return engine.image(ref) is not None


def _in_registry(ref: str) -> bool:
    """The registry has *ref*; False when it has not, or does not answer (:func:`get` says why)."""
    try:
        return manifest_digest(ref, credentials(ref.split("/", 1)[0])) is not None
    except (RegistryFault, UserError):
        return False


def get(engine: Engine, project: Project, platform: str, *, need: Need, update: bool,
        say: Callable[[str], object]) -> str:
    """The reference *platform*'s builds start FROM, settled as far as *need* asks: the one way to the base.

    - ``"pinned"`` (``builder build``, before anything is planned: the base is in every content tag):
      base.lock.json's pin as it is when that base can be had (local, or in the registry: a build pulls
      it). Asks the engine once, and the registry only for a base not local.
    - ``"local"`` (a view about to build FROM it): that base in the engine.
    - ``"published"`` (``builder base``): in the engine and in the matrix's registry, pinned there.

    What *need* does not find is settled (:func:`_settle`): an ``image:`` is pulled; a locked base is moved
    to a new registry, pushed where the registry lacks it, or pulled; else it is bootstrapped, pushed and
    pinned, re-pinned only with *update* (``--update-base``, ``builder base --update``) when the Debian
    mirror moved.
    """
    if need == "pinned":
        try:  # the pinned reference, or why there is none
            ref: str | None = pinned_base_refs(project.root, project.matrix, [platform], False,
                                               project.matrix_path.name)[platform]
        except UserError:
            if not update or project.matrix.base.image is not None:
                raise
            ref = None
        if ref is not None and (project.matrix.base.image is not None or local(engine, ref) or _in_registry(ref)):
            return ref
    elif need == "local":
        ref = project.base_for(platform)
        if local(engine, ref):
            return ref
        say(f"base {ref} ({platform}) is not local: fetching it")
    return _settle(engine, project, platform, update=update, say=say).reference


def pin(engine: Engine, project: Project, platforms_used: list[str], *, update: bool,
        say: Callable[[str], object]) -> Project:
    """*project* with each of *platforms_used* building FROM its pinned base (:func:`get`, ``"pinned"``)."""
    refs = {p: get(engine, project, p, need="pinned", update=update, say=say) for p in platforms_used}
    return dataclasses.replace(project, base_refs={**project.base_refs, **refs})


def image_id(engine: Engine, project: Project, platform: str) -> str:
    """The image ID of *platform*'s base as ``builder base`` reports it: base.lock.json's (the reproducible
    config digest) for a bootstrapped base, the engine's for an ``image:`` (after :func:`get`)."""
    if project.matrix.base.image is not None:
        return engine.resolve([project.matrix.base.image])
    lock = read_base_lock(project.root)
    if lock is None or platform not in lock.platforms:
        raise UserError(f"base.lock.json pins no base for {platform}; run 'builder base --platform {platform}'")
    return lock.platforms[platform].image_id


def check(project: Project, platforms_wanted: list[str], say: Callable[[str], object]) -> bool:
    """``builder base --check``: bootstrap each platform's base afresh (no engine) and say whether
    base.lock.json still pins it, package by package where not (:func:`_drift`); whether all match."""
    spec, lock = project.matrix.base.bootstrap, read_base_lock(project.root)
    if spec is None or lock is None:
        raise UserError("base --check needs a bootstrap: spec and a base.lock.json; run 'builder base' first")
    drifted = False
    for platform in platforms_wanted:
        pinned = lock.platforms.get(platform)
        if pinned is None:
            raise UserError(f"base.lock.json pins no base for {platform}; run 'builder base --platform {platform}'")
        with tempfile.TemporaryDirectory(prefix="builder-base-") as tmp:
            fresh, rootfs = image_id_of(spec, Path(tmp), platform)
        report = _drift(pinned, fresh, rootfs, recipe_hash(spec))
        if report is None:
            say(f"{platform}: base.lock.json matches a fresh bootstrap ({fresh})")
            continue
        drifted = True
        say(f"{platform}: base drift: a fresh bootstrap is {fresh}, base.lock.json pins {pinned.image_id}")
        for line in report:
            say(line)
    if drifted:
        say("run 'builder base --update' to re-pin, then commit base.lock.json and images/")
    return not drifted


def _drift(pinned: PinnedBase, fresh: str, rootfs: Rootfs, recipe: str) -> list[str] | None:
    """How a fresh bootstrap (image ID *fresh*, *rootfs*, made by *recipe*) differs from the *pinned*
    base, package by package; None when it is the pinned image (the Debian mirror did not move)."""
    if fresh == pinned.image_id:
        return None
    same = None if pinned.recipe_sha256 is None else pinned.recipe_sha256 == recipe
    return drift_report(pinned.packages, rootfs.packages, same)


def _settle(
    engine: Engine, project: Project, platform: str, *, update: bool, say: Callable[[str], object]
) -> PinnedBase:
    """*platform*'s pinned base local and in the registry, made when it can be had from nowhere (:func:`get`)."""
    matrix = project.matrix
    if matrix.base.image is not None:
        if not local(engine, matrix.base.image):
            say(f"pulling {matrix.base.image} ({platform})")
            engine.pull(matrix.base.image, credentials(matrix.base.image.split("/", 1)[0]), platform=platform)
        return PinnedBase(reference=matrix.base.image, image_id=engine.resolve([matrix.base.image]))
    started = ensure_local(matrix.registry.split("/", 1)[0])
    if started:
        say(started)
    lock = read_base_lock(project.root)
    if lock is not None and lock.spec_sha256 != spec_hash(matrix):
        lock = None  # made from another spec: every platform's pin is stale
    pinned = lock.platforms.get(platform) if lock is not None else None
    if lock is not None and pinned is not None:
        found = _locked(engine, project, platform, lock, pinned, say)
        if found is not None:
            return found
    return _bootstrap(engine, project, platform, lock, pinned, update=update, say=say)


def _locked(engine: Engine, project: Project, platform: str, lock: BaseLock, pinned: PinnedBase,
            say: Callable[[str], object]) -> PinnedBase | None:
    """The locked base without a bootstrap: moved to the matrix's new registry, local (pushed where
    the registry lacks it) or pulled; None when it can be had from nowhere (then it is bootstrapped)."""
    host = project.matrix.registry.split("/", 1)[0]
    if not pinned.reference.startswith(f"{project.base_repository}@"):
        moved = _move_to_registry(engine, project, platform, pinned, say)
        if moved is not None:
            write_base_lock(project.root, lock.with_platform(platform, moved))
            return moved
    if local(engine, pinned.reference):
        _push_if_missing(engine, project, platform, pinned, say)
        return pinned
    try:
        started = time.monotonic()
        with heartbeat(lambda: f"pulling the locked {platform} base ({time.monotonic() - started:.0f} s)"):
            engine.pull(pinned.reference, credentials(host), platform=platform)
        say(f"pulled the locked base {pinned.reference} ({platform})")
        return pinned
    except EngineError as exc:
        if not registry_answers(host):
            raise UserError(f"registry {host} is unreachable, so the locked {platform} base {pinned.reference} "
                            "can't be pulled; start it or fix 'registry' in matrix.yaml") from None
        say(f"the locked {platform} base is neither local nor in the registry ({exc}): bootstrapping it")
    return None


def _bootstrap(engine: Engine, project: Project, platform: str, lock: BaseLock | None,
               pinned: PinnedBase | None, *, update: bool, say: Callable[[str], object]) -> PinnedBase:
    """Bootstrap *platform*'s base, push it and pin it; a fresh bootstrap that differs from *pinned*
    (the Debian mirror moved) is re-pinned with *update* only."""
    spec = project.matrix.base.bootstrap
    assert spec is not None
    started, stage = time.monotonic(), ["writing its image and loading it into the engine"]
    with heartbeat(lambda: f"the {platform} base: {stage[0]} ({time.monotonic() - started:.0f} s)"):
        with tempfile.TemporaryDirectory(prefix="builder-base-") as tmp:
            image_id, rootfs = make_image(engine, project, Path(tmp), platform)
            stage[0] = "compressing its layer"
            layer = gzip_layer(rootfs.tarball)
        stage[0] = f"pushing it to {project.base_repository}"
        return _pin_bootstrapped(engine, project, platform, lock, pinned, image_id, rootfs, layer, update=update,
                                 say=say)


def _pin_bootstrapped(engine: Engine, project: Project, platform: str, lock: BaseLock | None,
                      pinned: PinnedBase | None, image_id: str, rootfs: Rootfs, layer: bytes, *, update: bool,
                      say: Callable[[str], object]) -> PinnedBase:
    """Push and pin a bootstrapped base (:func:`_bootstrap`'s second half)."""
    spec = project.matrix.base.bootstrap
    assert spec is not None
    recipe = recipe_hash(spec)
    if pinned is not None and (report := _drift(pinned, image_id, rootfs, recipe)) is not None:
        lines = [f"base drift ({platform}): a fresh bootstrap is {image_id}, base.lock.json pins {pinned.image_id}",
                 *report]
        if not update:
            raise UserError(*lines, "run 'builder base --update' to re-pin, then 'builder render' and commit both")
        for line in lines:
            say(line)
    digest = push_base(engine, project, platform, layer, image_config(rootfs, spec, platform))
    new = PinnedBase(reference=f"{project.base_repository}@{digest}", image_id=image_id, packages=rootfs.packages,
                     recipe_sha256=recipe)
    if new != pinned:
        current = lock or BaseLock(spec_sha256=spec_hash(project.matrix))
        write_base_lock(project.root, current.with_platform(platform, new))
        say(f"pinned the {platform} base in base.lock.json: {new.reference}")
    return new


def _move_to_registry(
    engine: Engine, project: Project, platform: str, pinned: PinnedBase, say: Callable[[str], object]
) -> PinnedBase | None:
    """The matrix's registry changed: the same base (copied from the old registry byte for byte, else
    pushed from the engine's copy) pinned in the new one; None when it can be had from neither (then it
    is bootstrapped)."""
    tag = base_tag(project, platform)
    digest = copy_base(pinned.reference, project.base_repository, tag_of(tag))
    if digest is not None:
        hold(engine, f"{project.base_repository}@{digest}", platform)
    elif local(engine, pinned.reference):
        with tempfile.TemporaryDirectory(prefix="builder-base-") as tmp:
            digest = push_base(engine, project, platform, *saved_blobs(engine, pinned.reference, Path(tmp)))
    if digest is None:
        say(f"the locked {platform} base {pinned.reference} is neither local nor in its old registry: bootstrapping it")
        return None
    moved = pinned.model_copy(update={"reference": f"{project.base_repository}@{digest}"})
    say(f"the registry changed: pinned the same {platform} base in {project.base_repository} ({digest})")
    return moved


def _push_if_missing(
    engine: Engine, project: Project, platform: str, pinned: PinnedBase, say: Callable[[str], object]
) -> None:
    if manifest_digest(pinned.reference, credentials(pinned.reference.split("/", 1)[0])) is None:
        with tempfile.TemporaryDirectory(prefix="builder-base-") as tmp:
            digest = push_base(engine, project, platform, *saved_blobs(engine, pinned.reference, Path(tmp)))
        say(f"pushed the {platform} base to {project.base_repository} ({digest})")
        if not pinned.reference.endswith(digest):
            say(f"note: the registry digest {digest} differs from the lock's {pinned.reference}")
