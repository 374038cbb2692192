"""``builder build``: build, smoke-test, tag and (optionally) push each target with docker-py.

Order per target: build (by image ID, untagged) -> smoke test -> tag -> push. A tag only
ever points at an image that finished building and passed its smoke test; an interrupted
build leaves the previous tags where they were, and the next run resumes from cache.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker

from builder.config import platforms
from builder.config.errors import TargetFailed, UserError
from builder.config.project import Project, ResolvedTarget
from builder.images import content, locks, publish, render, wheelhouse, wheelserver
from builder.images.outcome import Outcome
from builder.images.progress import Progress
from builder.oci import faults, registry

# smoke (and the host modules it needs) and base are imported where a target is really built, so
# that a no-op build (every target reused) stays well under a second as a whole process.

STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)")
#: After an interrupt: how long to wait for this run's containers to be gone, and how long
#: nothing may run before "none left" is believed (a create in flight when the engine saw the
#: disconnect still lands).
CLEANUP_S = 30.0
SETTLE_S = 0.5


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


def docker_build(
    client: docker.DockerClient,
    project: Project,
    target: ResolvedTarget,
    *,
    stage: str | None = None,
    cache_from: list[str] | None = None,
    on_step: Callable[[int, int, str], None] = lambda n, total, text: None,
    on_log: Callable[[str], None] = lambda line: None,
    wheels_at: str = "127.0.0.1",
    cancel: threading.Event | None = None,
    nocache: bool = False,
) -> tuple[str, int, int]:
    """Build one target (or one stage of it); return (image ID, cacheable steps, steps from cache).

    FROM lines (and the ARGs before the first) are not counted: they make no layer and are never
    "from cache". Once *cancel* is set, the next event ends the build: the connection closes and
    the engine cancels it.
    """
    steps = cached = stages = preamble = 0
    image_id = None
    stream = client.api.build(
        nocache=nocache,
        path=str(project.root),
        dockerfile=target.dockerfile,
        platform=target.platform,
        # The platform's base pin and architecture; EMULATED when it runs under qemu here.
        buildargs={**content.build_args(project, target), **({} if target.native else {"EMULATED": "1"})},
        target=stage,
        rm=True,
        forcerm=True,  # remove intermediate containers even when a step fails or is interrupted
        pull=False,
        network_mode="host",  # reach the loopback wheel server...
        extra_hosts={wheelserver.HOST: wheels_at},  # ...at this build's own address
        labels=None if stage else build_labels(project.root),
        cache_from=cache_from or None,
        decode=True,
    )
    try:
        for event in stream:
            if cancel is not None and cancel.is_set():
                raise TargetFailed("interrupted")
            if "error" in event:
                raise TargetFailed(_build_error(event["error"]))
            for line in event.get("stream", "").splitlines():
                if (m := STEP.match(line)) is not None:
                    steps = int(m[1])
                    stages += m[3].startswith("FROM ")
                    preamble += not stages  # ARG before the first FROM: no layer, never "from cache"
                    on_step(steps, int(m[2]), m[3].strip())
                elif "---> Using cache" in line:
                    cached += 1
                if line.strip():
                    on_log(line.rstrip())
            image_id = (event.get("aux") or {}).get("ID", image_id)
    finally:
        stream.close()  # frees the response now, not at exit: its socket closes, the engine cancels
    if image_id is None:
        raise TargetFailed("the engine finished the build without an image ID")
    return image_id, steps - stages - preamble, cached


def _build_error(message: str) -> str:
    text = message.strip()
    if wheelserver.HOST in text and "Connection refused" in text:
        text += " (the wheel server was not reachable: is the engine on this host? --network host needs it)"
    elif text.endswith("non-zero code: 137"):
        text += " (the step was killed, usually out of memory: give the engine more memory or use fewer --jobs)"
    return text


def run_commands(dockerfile: str) -> set[str]:
    """The RUN commands of a Dockerfile's text as the classic builder runs them, spaces squashed.

    Example:
        >>> run_commands(Path("images/cpu/Dockerfile").read_text())
        {'groupadd --gid 1001 app && useradd --uid 1001 ...', ...}
    """
    joined = re.sub(r"\\[ \t]*\n(?:[ \t]*(?:#[^\n]*)?\n)*", " ", dockerfile)  # continuations, their comments
    commands = set()
    for line in joined.splitlines():
        if (m := re.match(r"\s*RUN\s+(.*)", line, re.IGNORECASE)) is None:
            continue
        command = m[1]
        if command.startswith("["):  # exec form: the container's Cmd is the list itself
            try:
                command = json.loads(command)[-1]
            except (json.JSONDecodeError, IndexError, TypeError):
                pass
        commands.add(" ".join(str(command).split()))
    return commands


class OwnContainers:
    """The containers one ``build_all`` starts, so that an interrupt removes those and no others.

    The classic builder's intermediate containers carry no label of ours. One is this run's
    when it is new since the run began, maps the wheel server's name to this run's loopback
    address (no concurrent run holds it) and runs a RUN line of a Dockerfile being built, or a
    metadata step ("#(nop) ..."). Smoke containers carry the smoke label with this process's ID.
    """

    def __init__(self, client: docker.DockerClient, dockerfiles: list[Path], wheels_at: str) -> None:
        self.client = client
        self.dockerfiles = dockerfiles
        self.host = f"{wheelserver.HOST}:{wheels_at}"
        self.owner = str(os.getpid())  # the value smoke.run_container gives SMOKE_LABEL
        self.before = {c["Id"] for c in client.api.containers(all=True, quiet=True)}
        self._steps: set[str] | None = None
        self._seen: dict[str, bool] = {}

    def find(self) -> list[str]:
        """IDs of this run's containers that are still there."""
        return [c["Id"] for c in self.client.api.containers(all=True)
                if c["Id"] not in self.before and self._ours(c)]

    def remove(self, running: Callable[[], bool] = lambda: False, say: Callable[[str], None] = print,
               timeout: float = CLEANUP_S) -> None:
        """Force-remove this run's containers until none is left and nothing that starts them runs.

        Bounded by *timeout*; what is still there then is named with the command to remove it.
        """
        deadline = time.monotonic() + timeout
        quiet_from = time.monotonic()
        while True:
            busy = running()
            left = self.find()
            for cid in left:
                try:
                    self.client.api.remove_container(cid, force=True)
                except docker.errors.APIError:
                    pass  # gone already, or the engine's own removal is in progress: look again
            now = time.monotonic()
            quiet_from = now if busy else quiet_from
            if not left and not busy and now - quiet_from >= SETTLE_S:
                return
            if now > deadline:
                if left:
                    say(f"{len(left)} containers of this build are still there after {timeout:.0f} s; "
                        f"remove them with: docker rm -f {' '.join(c[:12] for c in left)}")
                return
            time.sleep(0.1)

    def _ours(self, summary: dict[str, Any]) -> bool:
        from builder.images.smoke import SMOKE_LABEL

        if (summary.get("Labels") or {}).get(SMOKE_LABEL) == self.owner:
            return True
        if (summary.get("HostConfig") or {}).get("NetworkMode") != "host":
            return False
        cid = summary["Id"]
        if cid not in self._seen:
            try:
                info = self.client.api.inspect_container(cid)
            except docker.errors.NotFound:
                return False
            cmd = info["Config"].get("Cmd") or [""]
            self._seen[cid] = self.host in (info["HostConfig"].get("ExtraHosts") or []) and (
                cmd[-1].startswith("#(nop) ") or " ".join(cmd[-1].split()) in self.steps)
        return self._seen[cid]

    @property
    def steps(self) -> set[str]:
        if self._steps is None:
            self._steps = {c for path in self.dockerfiles if path.is_file() for c in run_commands(path.read_text())}
        return self._steps


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
    wheels_at: str,
    cache_also: Sequence[str] = (),
    nocache: bool = False,
    content_tag: str | None = None,
) -> Outcome:
    """Build, smoke-test and tag (the content tag only once tested), then push one target.

    Never raises for the target's own failures.
    """
    out = Outcome(target.name, target.platform,
                  content_tag=content_tag or content.content_tags(project, [target])[target.unit])
    start = time.monotonic()
    ui.start(target.unit)
    try:
        _build(client, project, target, out, ui, smoke=smoke, cancel=cancel, wheels_at=wheels_at,
               cache_also=cache_also, nocache=nocache)
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
    out.size_bytes = image["Size"]
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
    wheels_at: str,
    cache_also: Sequence[str],
    nocache: bool,
) -> None:
    pulled = [] if nocache else _cache_sources(client, target)
    cache_from = [*pulled, *cache_also] if pulled else []
    out.image_id, out.steps, out.cached_steps = docker_build(
        client, project, target, cache_from=cache_from, wheels_at=wheels_at, cancel=cancel, nocache=nocache,
        on_step=lambda n, total, text: ui.step(target.unit, n, total, text),
        on_log=lambda line: ui.log(target.unit, line),
    )
    out.result = "built"
    if cancel.is_set():
        raise TargetFailed("interrupted")
    out.size_bytes = client.api.inspect_image(out.image_id)["Size"]
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
    """On a fresh runner, the target's published image pulled as a cache source.

    Returns [] when the image is already local (the local cache covers it; naming it as a
    source would make the classic builder re-run the final metadata steps) or was never
    published. With sources, the classic builder accepts a local hit only inside their layer
    chains, so callers add the shared stage's image when they built it just now.
    """
    ref = target.local_refs[0]
    try:
        client.api.inspect_image(ref)
        return []
    except docker.errors.ImageNotFound:
        pass
    try:
        client.api.pull(*ref.rsplit(":", 1), platform=target.platform,
                        auth_config=registry.credentials(registry.Ref.parse(ref).host))
    except docker.errors.DockerException as exc:
        if never_published(exc):
            return []  # build cold
        raise TargetFailed(f"pulling the cache source {ref} failed, not for want of it: "
                           f"{faults.describe(exc).line}") from None
    return [ref]


def never_published(exc: docker.errors.DockerException) -> bool:
    """A pull failed because the registry has no such image; not auth, disk or a rate limit."""
    if isinstance(exc, docker.errors.NotFound):
        return True
    text = str(getattr(exc, "explanation", None) or exc).lower()
    return "manifest unknown" in text or ("not found" in text and "unauthorized" not in text)


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
        rendered = render.render(project, targets)
        render.write(rendered)
        tags = content.content_tags(project, targets, rendered)
        ui.say(f"re-rendered the Dockerfiles for the new base pins {pins}; commit base.lock.json and images/")
    cancel, halt = threading.Event(), threading.Event()
    with wheelserver.serve(wheelhouse.location(), project.matrix.wheelhouse_port) as wheels_at:
        own = OwnContainers(client, [project.root / t.dockerfile for t in buildable], wheels_at)

        def one(t: ResolvedTarget, cache_also: list[str]) -> Outcome | None:
            if cancel.is_set() or halt.is_set():
                return None  # not started: interrupted, or a target failed without --keep-going
            try:
                outcome = process(client, project, t, ui, push=push, smoke=smoke, cancel=cancel, wheels_at=wheels_at,
                                  cache_also=cache_also, nocache=rebuild, content_tag=tags[t.unit])
            except Exception as exc:  # noqa: BLE001 - one line in its outcome, never re-raised from f.result()
                outcome = Outcome(t.name, t.platform, content_tag=tags[t.unit], error=faults.describe(exc).line)
            if outcome.error and not keep_going:
                halt.set()
            return outcome

        futures: list[Future[Outcome | None]] = []
        try:
            if jobs > 1 and len(buildable) > 1:
                # Shared stage once, then the targets side by side on a warm cache.
                ui.say("building the shared stage once")
                common, _, _ = docker_build(client, project, buildable[0], stage="common", wheels_at=wheels_at,
                                            cancel=cancel, on_log=lambda line: ui.log("common", line))
                pool = ThreadPoolExecutor(max_workers=jobs)
                try:
                    for t in buildable:  # one by one: an interrupt sees every future submitted so far
                        futures.append(pool.submit(one, t, [common]))
                    outcomes += [o for f in futures if (o := f.result()) is not None]
                finally:
                    pool.shutdown(wait=False, cancel_futures=True)  # an interrupt must not wait for builds
            else:
                for t in buildable:
                    if (outcome := one(t, [])) is None:
                        break
                    outcomes.append(outcome)
        except KeyboardInterrupt:
            # The interrupted connections are closed, so the engine cancels those builds and
            # removes their containers, but on its own time: wait for that (workers too, woken by
            # their containers going) so that nothing is left when the process exits.
            cancel.set()
            own.remove(running=lambda: any(not f.done() for f in futures), say=ui.say)
            raise
        except TargetFailed as exc:
            raise UserError(f"building the shared stage failed: {exc}") from None
    return outcomes
