"""``builder build``: build (BuildKit), smoke-test, tag and (optionally) push each target.

Order per target: build (by image ID, untagged) -> smoke test -> tag -> push. Builds go
through ``docker buildx`` (:mod:`builder.oci.buildkit`); everything else through docker-py. A tag only
ever points at an image that finished building and passed its smoke test; an interrupted
build leaves the previous tags where they were, and the next run resumes from cache.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import docker

from builder.config import platforms
from builder.config.errors import TargetFailed, UserError
from builder.config.project import Project, ResolvedTarget
from builder.images import content, locks, publish, render, wheelhouse
from builder.images.outcome import Outcome
from builder.images.progress import Progress
from builder.oci import buildkit, engine, faults, registry

# smoke (and the host modules it needs) and base are imported where a target is really built, so
# that a no-op build (every target reused) stays well under a second as a whole process.

#: After an interrupt: how long to wait for the cancelled builds and this run's smoke containers.
CLEANUP_S = 30.0


def build_labels(root: Path) -> dict[str, str]:
    """Labels that vary per commit, applied at build time (not rendered, so images/ stays stable).

    ``created`` is the commit time, not the wall clock, so a no-op rebuild stays a cache hit.
    """

    def git(*args: str) -> str:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    revision = git("rev-parse", "HEAD") or "unknown"
    if revision != "unknown" and git("status", "--porcelain", "--untracked-files=no"):
        revision += "-dirty"  # never claim a commit the image was not built from
    created = git("log", "-1", "--format=%cI") or "1970-01-01T00:00:00Z"
    return {"org.opencontainers.image.revision": revision, "org.opencontainers.image.created": created}


def build_request(
    project: Project, target: ResolvedTarget, *, stage: str | None = None, cache_from: Sequence[str] = (),
    nocache: bool = False, contexts: dict[str, str] | None = None, registry_cache: bool = False,
) -> buildkit.BuildRequest:
    """The build of one target view (or one stage of it), as data: what ``builder bake`` writes too.

    The wheels arrive as the named context ``wheels`` (no network); the base pin, each layer's
    wheels and EMULATED (a foreign platform under qemu here) as build arguments; inline cache
    metadata goes into the image, so a runner that lacks it can use the published image as cache.
    With *registry_cache* every step's cache also goes to :func:`cache_ref` (mode=max), which a
    fresh runner then reads first.
    SOURCE_DATE_EPOCH (the commit time, as the ``created`` label) fixes the image config's own
    times, so two runners building one commit from cache make the very same image; BuildKit
    keeps it out of every step's cache key.
    """
    labels = build_labels(project.root)
    epoch = int(datetime.fromisoformat(labels["org.opencontainers.image.created"]).timestamp())
    return buildkit.BuildRequest(
        dockerfile=target.dockerfile,
        context=".",
        platform=target.platform,
        build_args={**content.build_args(project, target), **({} if target.native else {"EMULATED": "1"}),
                    "SOURCE_DATE_EPOCH": str(epoch)},
        contexts=contexts if contexts is not None else {"wheels": str(wheels_context(project, target))},
        labels={} if stage else labels,
        stage=stage,
        cache_from=tuple(f"type=registry,ref={ref}" for ref in cache_from),
        cache_to=("type=inline", *([registry_cache_sink(target)] if registry_cache else [])),
        no_cache=nocache,
        builder=os.environ.get("BUILDX_BUILDER") or None,
        compression=target.compression,
    )


def cache_ref(target: ResolvedTarget) -> str:
    """Where ``--push`` keeps a target view's BuildKit cache: a tag beside its images.

    Example:
        >>> cache_ref(project.target("nvidia-cu130").on("linux/arm64"))
        'localhost:5000/ml-runtime:buildcache-nvidia-cu130-arm64'
    """
    return f"{target.primary_ref.rsplit(':', 1)[0]}:buildcache-{target.name}-{target.arch}"


def registry_cache_sink(target: ResolvedTarget) -> str:
    """``--cache-to`` for :func:`cache_ref`: every step (mode=max), in the target's compression."""
    force = ",force-compression=true" if target.compression != "gzip" else ""
    return f"type=registry,ref={cache_ref(target)},mode=max,compression={target.compression}{force}"


def registry_cache_supported(client: docker.DockerClient) -> bool:
    """Whether builds here can export a registry cache: the docker driver can with the containerd
    image store only; a builder the user selects (docker-container, remote, kubernetes) always can."""
    return bool(os.environ.get("BUILDX_BUILDER")) or engine.image_store(client.info()) == "containerd"


def wheels_context(project: Project, target: ResolvedTarget) -> Path:
    """The folder the build context ``wheels`` is: the view's wheels, one folder per layer."""
    from builder.images import layers

    return wheelhouse.build_context(layers.context_layers(project, target))


def docker_build(
    client: docker.DockerClient,
    project: Project,
    target: ResolvedTarget,
    *,
    stage: str | None = None,
    cache_from: Sequence[str] = (),
    on_step: Callable[[int, int, str], None] = lambda n, total, text: None,
    on_log: Callable[[str], None] = lambda line: None,
    cancel: threading.Event | None = None,
    nocache: bool = False,
    registry_cache: bool = False,
) -> tuple[str, int, int, tuple[str, ...]]:
    """Build one target view (or one stage of it) through BuildKit; return (image ID, steps, steps
    from cache, the registry caches read)."""
    request = build_request(project, target, stage=stage, cache_from=cache_from, nocache=nocache,
                            registry_cache=registry_cache)
    host = registry.Ref.parse(target.primary_ref).host
    # BuildKit reads the base and the cache from the registry itself, with the same credentials.
    result = buildkit.run(request, on_step=on_step, on_log=on_log, cancel=cancel, registry_host=host,
                          creds=registry.credentials(host), cwd=project.root)
    return engine.image_id(client, result.ids), result.steps, result.cached, result.cache_read


def remove_smoke_containers(client: docker.DockerClient, say: Callable[[str], None] = print,
                            timeout: float = CLEANUP_S) -> None:
    """After an interrupt: force-remove the smoke containers this process started (by their label).

    BuildKit's own step containers are not the engine's: a cancelled build leaves none.
    """
    from builder.images.smoke import SMOKE_LABEL

    deadline = time.monotonic() + timeout
    label = f"{SMOKE_LABEL}={os.getpid()}"
    while True:
        left = [c["Id"] for c in client.api.containers(all=True, filters={"label": label})]
        for cid in left:
            try:
                client.api.remove_container(cid, force=True)
            except docker.errors.APIError:
                pass  # gone already, or being removed: look again
        if not left:
            return
        if time.monotonic() > deadline:
            say(f"{len(left)} smoke containers are still there after {timeout:.0f} s; "
                f"remove them with: docker rm -f {' '.join(c[:12] for c in left)}")
            return
        time.sleep(0.2)


def _tag(client: docker.DockerClient, image_id: str, refs: list[str], present: Sequence[str] = ()) -> None:
    """Point each of *refs* at the image; those in *present* (its RepoTags) already do."""
    for ref in refs:
        if ref not in present:
            repo, tag = ref.rsplit(":", 1)
            client.api.tag(image_id, repo, tag, force=True)


def process(
    client: docker.DockerClient,
    project: Project,
    target: ResolvedTarget,
    ui: Progress,
    *,
    push: bool,
    smoke: bool,
    cancel: threading.Event,
    nocache: bool = False,
    content_tag: str | None = None,
    registry_cache: bool = False,
) -> Outcome:
    """Build, smoke-test and tag (the content tag only once tested), then push one target.

    With *registry_cache* (``--push`` where :func:`registry_cache_supported`) the build's cache
    goes to the registry too. Never raises for the target's own failures.
    """
    out = Outcome(target.name, target.platform,
                  content_tag=content_tag or content.content_tags(project, [target])[target.unit])
    start = time.monotonic()
    ui.start(target.unit)
    try:
        _build(client, project, target, out, ui, smoke=smoke, cancel=cancel, nocache=nocache,
               registry_cache=registry_cache)
        if push:
            ui.step(target.unit, out.steps, out.steps, "push")
            _publish(client, project, target, out, out.image_id or "")
    except TargetFailed as exc:
        out.error = str(exc)
    except UserError as exc:
        out.error = str(exc)
    except faults.KNOWN as exc:
        out.error = faults.describe(exc).line
    out.seconds = round(time.monotonic() - start, 2)
    ui.done(target.unit, out)
    return out


def reuse(
    client: docker.DockerClient, project: Project, target: ResolvedTarget, ui: Progress, *, push: bool, pull: bool,
    content_tag: str,
) -> Outcome | None:
    """The outcome of reusing this exact content, present here or in the registry; None to build.

    Present locally: only the tags move (no build, no smoke). In the registry: skipped (one
    manifest request); pulled only with ``pull``; with ``push`` its tags move in the registry.
    """
    start = time.monotonic()
    out = Outcome(target.name, target.platform, content_tag=content_tag)
    try:
        if not _reuse(client, project, target, out, push=push, pull=pull):
            return None
    except (UserError, TargetFailed) as exc:  # e.g. the registry refused the push of the moved tags
        out.error = str(exc)
    except faults.KNOWN as exc:
        out.error = faults.describe(exc).line
    out.seconds = round(time.monotonic() - start, 2)
    ui.start(target.unit)
    ui.done(target.unit, out)
    return out


def _reuse(
    client: docker.DockerClient, project: Project, target: ResolvedTarget, out: Outcome, *, push: bool, pull: bool
) -> bool:
    ref = out.content_tag or ""
    try:
        image = client.api.inspect_image(ref)
        out.image_id, out.result = image["Id"], "reused-local"
    except docker.errors.ImageNotFound:
        host = registry.Ref.parse(ref).host
        if not registry.ping(host, timeout=2.0):
            return False  # no registry answers (the local default, not started): build
        creds = registry.credentials(host)
        digest = registry.manifest_digest(ref, creds)
        if digest is None:
            return False
        out.result, out.digest, out.smoke = "reused-registry", digest, "passed earlier"
        if pull:
            client.api.pull(*ref.rsplit(":", 1), auth_config=creds)
            image = client.api.inspect_image(ref)
            out.image_id = image["Id"]
        elif push:  # move the tags in the registry itself: no pull needed
            moved = publish.image_refs(target)
            for tag_ref in moved:
                registry.copy_tag(ref, tag_ref.rsplit(":", 1)[1], creds)
            publish.record(project.root, [{**publish.published(target, None, digest, moved),
                                           "content_tag": ref, "result": out.result, "revision": None,
                                           "current_revision": _current_revision(project)}])
            out.tags = [r.rsplit(":", 1)[1] for r in moved]
            return True
        else:
            return True  # known good in the registry; nothing local to tag
    out.smoke = "passed earlier"
    out.size_bytes = engine.image_size(client, out.image_id)
    _tag(client, out.image_id, target.local_refs, present=image.get("RepoTags") or ())
    out.tags = [r.rsplit(":", 1)[1] for r in target.local_refs]
    if push:
        _publish(client, project, target, out, out.image_id)
    return True


def _build(
    client: docker.DockerClient,
    project: Project,
    target: ResolvedTarget,
    out: Outcome,
    ui: Progress,
    *,
    smoke: bool,
    cancel: threading.Event,
    nocache: bool,
    registry_cache: bool = False,
) -> None:
    cache_from = [] if nocache else _cache_sources(client, target)
    out.image_id, out.steps, out.cached_steps, out.cache_read = docker_build(
        client, project, target, cache_from=cache_from, cancel=cancel, nocache=nocache, registry_cache=registry_cache,
        on_step=lambda n, total, text: ui.step(target.unit, n, total, text),
        on_log=lambda line: ui.log(target.unit, line),
    )
    out.result = "built"
    if cancel.is_set():
        raise TargetFailed("interrupted")
    out.size_bytes = engine.image_size(client, out.image_id)
    if smoke:
        from builder.images.smoke import smoke_test

        ui.step(target.unit, out.steps, out.steps, "smoke test")
        result = smoke_test(client, project, target, out.image_id, log=lambda s: ui.log(target.unit, s))
        out.smoke, out.notes = result.status, list(result.skipped)
        if result.status == "failed":
            raise TargetFailed(f"smoke test failed: {result.summary()}")
        # Only a tested image carries the content tag: its presence is the proof.
        _tag(client, out.image_id, [out.content_tag or ""])
    _tag(client, out.image_id, target.local_refs)
    out.tags = [r.rsplit(":", 1)[1] for r in target.local_refs]


def publish_built(client: docker.DockerClient, project: Project, target: ResolvedTarget, content_tag: str) -> Outcome:
    """``builder push`` of a target view built earlier: what ``build --push`` publishes for it.

    Its content tag goes along when it is local on the same image (the smoke test passed on this
    very content), so the registry can tell it was tested, and a multi-platform index can list it.
    """
    out = Outcome(target.name, target.platform, content_tag=content_tag, result="pushed")
    image_id = client.api.inspect_image(target.local_refs[0])["Id"]
    try:
        tested = client.api.inspect_image(content_tag)["Id"] == image_id
    except docker.errors.ImageNotFound:
        tested = False
    out.smoke = "passed earlier" if tested else "skipped"
    out.image_id = image_id
    _publish(client, project, target, out, image_id)
    return out


def _publish(client: docker.DockerClient, project: Project, target: ResolvedTarget, out: Outcome,
             image_id: str) -> None:
    tested = [out.content_tag] if out.smoke != "skipped" and out.content_tag else []
    record = publish.push_target(client, target, image_id, tested + publish.image_refs(target))
    out.digest = record["digest"]
    revision = client.api.inspect_image(image_id)["Config"]["Labels"].get("org.opencontainers.image.revision")
    publish.record(project.root, [{**record, "content_tag": out.content_tag, "result": out.result,
                                   "revision": revision, "current_revision": _current_revision(project)}])


def _current_revision(project: Project) -> str:
    return build_labels(project.root)["org.opencontainers.image.revision"]


def _cache_sources(client: docker.DockerClient, target: ResolvedTarget) -> list[str]:
    """On a fresh runner, the registry cache ``--push`` exported (:func:`cache_ref`), else the
    target's published image (its inline cache metadata), as the cache source.

    Returns [] when the image is already local (BuildKit's own cache covers it). BuildKit reads
    the registry itself, layer by layer as needed: nothing is pulled first.
    """
    ref = target.local_refs[0]
    try:
        client.api.inspect_image(ref)
        return []
    except docker.errors.ImageNotFound:
        return registry_cache_source(cache_ref(target)) or registry_cache_source(ref)


def registry_cache_source(ref: str) -> list[str]:
    """[*ref*] when the registry has it, [] when it was never published or no registry answers (a cold build).

    Asked before the build, so that a refusal (auth, a rate limit, a registry down) names its cause
    instead of passing for "never published": BuildKit itself only warns and builds cold.
    """
    host = registry.Ref.parse(ref).host
    if not registry.ping(host, timeout=2.0):
        return []  # no registry answers (the local default, not started): nothing to read
    try:
        published = registry.manifest_digest(ref, registry.credentials(host)) is not None
    except faults.KNOWN as exc:
        raise TargetFailed(f"reading the cache source {ref} failed, not for want of it: "
                           f"{faults.describe(exc).line}") from None
    return [ref] if published else []


def ensure_base_present(
    client: docker.DockerClient, project: Project, platform: str, say: Callable[[str], None], update: bool = False
) -> str:
    """*platform*'s pinned base must be local; bring it (pull, or bootstrap) if not; return its reference.

    With ``update``, a bootstrap that differs from the pin (the Debian mirror moved) is re-pinned,
    and the returned reference is the new one.
    """
    ref = project.base_for(platform)
    try:
        client.api.inspect_image(ref)
        return ref
    except docker.errors.ImageNotFound:
        pass
    from builder.images.base import ensure_base

    say(f"base {ref} ({platform}) is not local: fetching it")
    return ensure_base(client, project, platform, update=update, say=say).reference


def build_all(
    client: docker.DockerClient,
    project: Project,
    targets: list[ResolvedTarget],
    ui: Progress,
    *,
    push: bool = False,
    smoke: bool = True,
    keep_going: bool = False,
    jobs: int = 1,
    rebuild: bool = False,
    pull: bool = False,
    update_base: bool = False,
) -> list[Outcome]:
    """Reuse or build every target view (one per platform); with ``keep_going`` a failure doesn't stop the others.

    First, from the committed locks alone (no wheels fetched), each view whose content tag
    exists locally or in the registry is reused; only the rest fetch wheels, need their
    platform's base and are built. ``rebuild`` builds everything, without the layer cache.
    With ``push``, a target with several platforms then gets one index under each of its tags.
    """
    outcomes = _reuse_or_build(client, project, targets, ui, push=push, smoke=smoke, keep_going=keep_going,
                               jobs=jobs, rebuild=rebuild, pull=pull, update_base=update_base)
    if push:
        for name in dict.fromkeys(t.name for t in targets if len(t.platforms) > 1):
            if any(o.target == name and not o.error for o in outcomes):
                try:
                    ui.say(publish.push_index(project, project.target(name), _current_revision(project)))
                except TargetFailed as exc:  # its platform images are in; its own tags are not moved
                    why = " (content tags are pushed after a passed smoke test only: drop --no-smoke)" if not smoke else ""
                    for o in outcomes:
                        if o.target == name and not o.error:
                            o.error = f"no index written under its tags: {exc}{why}"
    return outcomes


def _reuse_or_build(
    client: docker.DockerClient, project: Project, targets: list[ResolvedTarget], ui: Progress, *, push: bool,
    smoke: bool, keep_going: bool, jobs: int, rebuild: bool, pull: bool, update_base: bool,
) -> list[Outcome]:
    failed_locks = locks.lock_all(project, targets, ui.say, fetch=False)
    rendered = render.render(project, targets)
    render.write(rendered)
    tags = content.content_tags(project, targets, rendered)
    outcomes: list[Outcome] = []
    buildable = []
    for t in targets:
        if t.unit in failed_locks:
            outcomes.append(Outcome(t.name, t.platform, error=failed_locks[t.unit]))
            ui.done(t.unit, outcomes[-1])
        elif not rebuild and (reused := reuse(client, project, t, ui, push=push, pull=pull,
                                              content_tag=tags[t.unit])) is not None:
            outcomes.append(reused)
        else:
            buildable.append(t)
    if (failed_locks or any(o.error for o in outcomes)) and not keep_going:
        return outcomes
    if not buildable:
        return outcomes
    # A foreign platform without emulation fails now, with the fix; the others fetch their wheels.
    failed_fetch = {t.unit: problem for t in buildable if (problem := platforms.emulation_problem(t.platform))}
    failed_fetch |= locks.lock_all(project, [t for t in buildable if t.unit not in failed_fetch], lambda line: None)
    for t in [t for t in buildable if t.unit in failed_fetch]:
        outcomes.append(Outcome(t.name, t.platform, error=failed_fetch[t.unit]))
        ui.done(t.unit, outcomes[-1])
    buildable = [t for t in buildable if t.unit not in failed_fetch]
    if (failed_fetch and not keep_going) or not buildable:
        return outcomes
    pins = {p: ensure_base_present(client, project, p, ui.say, update=update_base)
            for p in dict.fromkeys(t.platform for t in buildable)}
    if any(project.base_for(p) != ref for p, ref in pins.items()):  # re-pinned: builds start FROM the new base
        project = dataclasses.replace(project, base_refs={**project.base_refs, **pins})
        tags = content.content_tags(project, targets, rendered)  # BASE is a build argument: in the tag
        ui.say(f"re-pinned the base {pins} in base.lock.json; commit it")
    registry_cache = push and registry_cache_supported(client)  # one engine request, not one per target
    cancel, halt = threading.Event(), threading.Event()
    futures: list[Future[Outcome | None]] = []

    def one(t: ResolvedTarget) -> Outcome | None:
        if cancel.is_set() or halt.is_set():
            return None  # not started: interrupted, or a target failed without --keep-going
        try:
            outcome = process(client, project, t, ui, push=push, smoke=smoke, cancel=cancel, nocache=rebuild,
                              registry_cache=registry_cache,
                              content_tag=tags[t.unit])
        except Exception as exc:  # noqa: BLE001 - one line in its outcome, never re-raised from f.result()
            outcome = Outcome(t.name, t.platform, content_tag=tags[t.unit], error=faults.describe(exc).line)
        if outcome.error and not keep_going:
            halt.set()
        return outcome

    try:
        if jobs > 1 and len(buildable) > 1:
            # Shared stage once, then the targets side by side on a warm cache.
            ui.say("building the shared stage once")
            docker_build(client, project, buildable[0], stage="common", cancel=cancel,
                         on_log=lambda line: ui.log("common", line))
            pool = ThreadPoolExecutor(max_workers=jobs)
            try:
                for t in buildable:  # one by one: an interrupt sees every future submitted so far
                    futures.append(pool.submit(one, t))
                outcomes += [o for f in futures if (o := f.result()) is not None]
            finally:
                pool.shutdown(wait=False, cancel_futures=True)  # an interrupt must not wait for builds
        else:
            for t in buildable:
                if (outcome := one(t)) is None:
                    break
                outcomes.append(outcome)
    except KeyboardInterrupt:
        # Each running build's buildx gets SIGINT (BuildKit cancels it: no step container stays);
        # wait for the workers, then remove the smoke containers this run started.
        cancel.set()
        deadline = time.monotonic() + CLEANUP_S
        while any(not f.done() for f in futures) and time.monotonic() < deadline:
            time.sleep(0.1)
        remove_smoke_containers(client, say=ui.say)
        raise
    except TargetFailed as exc:
        raise UserError(f"building the shared stage failed: {exc}") from None
    return outcomes
