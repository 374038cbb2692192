"""``builder build``: build, smoke-test, tag and (optionally) push each target with docker-py.

Order per target: build (by image ID, untagged) -> smoke test -> tag -> push. A tag only
ever points at an image that finished building and passed its smoke test; an interrupted
build leaves the previous tags where they were, and the next run resumes from cache.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import docker

from builder import publish, render, wheels, wheelserver
from builder.base import ensure_base
from builder.errors import TargetFailed, UserError
from builder.progress import Progress
from builder.project import Project, ResolvedTarget
from builder.smoke import smoke_test

STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)")


@dataclass
class Outcome:
    """What happened to one target; ``--json`` prints a list of these."""

    target: str
    tags: list[str] = field(default_factory=list)
    image_id: str | None = None
    size_bytes: int | None = None
    seconds: float = 0.0
    steps: int = 0
    cached_steps: int = 0
    smoke: str = "skipped"
    digest: str | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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
) -> tuple[str, int, int]:
    """Build one target (or one stage of it); return (image ID, cacheable steps, steps from cache).

    FROM lines are not counted: they start a stage and are never "from cache".
    """
    steps = cached = stages = 0
    image_id = None
    stream = client.api.build(
        path=str(project.root),
        dockerfile=target.dockerfile,
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
    for event in stream:
        if "error" in event:
            raise TargetFailed(_build_error(event["error"]))
        for line in event.get("stream", "").splitlines():
            if (m := STEP.match(line)) is not None:
                steps = int(m[1])
                stages += m[3].startswith("FROM ")
                on_step(steps, int(m[2]), m[3].strip())
            elif "---> Using cache" in line:
                cached += 1
            if line.strip():
                on_log(line.rstrip())
        image_id = (event.get("aux") or {}).get("ID", image_id)
    if image_id is None:
        raise TargetFailed("the engine finished the build without an image ID")
    return image_id, steps - stages, cached


def _build_error(message: str) -> str:
    text = message.strip()
    if wheelserver.HOST in text and ("Connection refused" in text or "find-links" in text):
        text += " (the wheel server was not reachable: is the engine on this host? --network host needs it)"
    return text


def _tag(client: docker.DockerClient, image_id: str, refs: list[str]) -> None:
    for ref in refs:
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
    cache_also: list[str] = (),
) -> Outcome:
    """Build, smoke-test, tag and push one target; never raises for the target's own failures."""
    out = Outcome(target.name)
    start = time.monotonic()
    ui.start(target.name)
    try:
        pulled = _cache_sources(client, target)
        cache_from = [*pulled, *cache_also] if pulled else []
        out.image_id, out.steps, out.cached_steps = docker_build(
            client, project, target, cache_from=cache_from, wheels_at=wheels_at,
            on_step=lambda n, total, text: ui.step(target.name, n, total, text),
            on_log=lambda line: ui.log(target.name, line),
        )
        if cancel.is_set():
            raise TargetFailed("interrupted")
        out.size_bytes = client.api.inspect_image(out.image_id)["Size"]
        if smoke:
            ui.step(target.name, out.steps, out.steps, "smoke test")
            result = smoke_test(client, project, target, out.image_id, log=lambda s: ui.log(target.name, s))
            out.smoke = result.status
            if result.status == "failed":
                raise TargetFailed(f"smoke test failed: {result.summary()}")
        _tag(client, out.image_id, target.refs)
        out.tags = list(target.tags)
        if push:
            ui.step(target.name, out.steps, out.steps, "push")
            record = publish.push_target(client, target, out.image_id)
            out.digest = record["digest"]
            publish.record(project.root, [record])
    except TargetFailed as exc:
        out.error = str(exc)
    except docker.errors.DockerException as exc:
        out.error = f"engine error: {exc}"
    out.seconds = round(time.monotonic() - start, 2)
    ui.done(target.name, out)
    return out


def _cache_sources(client: docker.DockerClient, target: ResolvedTarget) -> list[str]:
    """On a fresh runner, the target's published image pulled as a cache source.

    Returns [] when the image is already local (the local cache covers it; naming it as a
    source would make the classic builder re-run the final metadata steps) or was never
    published. With sources, the classic builder accepts a local hit only inside their layer
    chains, so callers add the shared stage's image when they built it just now.
    """
    ref = target.primary_ref
    try:
        client.api.inspect_image(ref)
        return []
    except docker.errors.ImageNotFound:
        pass
    try:
        client.api.pull(*ref.rsplit(":", 1))
    except docker.errors.DockerException:
        return []  # never published yet: build cold
    return [ref]


def ensure_base_present(client: docker.DockerClient, project: Project, say: Callable[[str], None]) -> None:
    """The pinned base must be local; bring it (pull, or bootstrap) if not."""
    try:
        client.api.inspect_image(project.base_ref)
        return
    except docker.errors.ImageNotFound:
        pass
    say(f"base {project.base_ref} is not local: fetching it")
    ensure_base(client, project, update=False, say=say)


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
) -> list[Outcome]:
    """Build every target; with ``keep_going`` a failure doesn't stop the others."""
    ensure_base_present(client, project, ui.say)
    failed_locks = wheels.lock_all(project, targets, ui.say)
    render.write(render.render(project, targets))
    outcomes: list[Outcome] = []
    buildable = []
    for t in targets:
        if t.name in failed_locks:
            outcomes.append(Outcome(t.name, error=failed_locks[t.name]))
            ui.done(t.name, outcomes[-1])
        else:
            buildable.append(t)
    if failed_locks and not keep_going:
        return outcomes
    cancel = threading.Event()
    with wheelserver.serve(wheels.wheelhouse(), project.matrix.wheelhouse_port) as wheels_at:
        try:
            if jobs > 1 and len(buildable) > 1:
                # Shared stage once, then the targets side by side on a warm cache.
                ui.say("building the shared stage once")
                common, _, _ = docker_build(client, project, buildable[0], stage="common", wheels_at=wheels_at,
                                            on_log=lambda line: ui.log("common", line))
                with ThreadPoolExecutor(max_workers=jobs) as pool:
                    futures = [pool.submit(process, client, project, t, ui, push=push, smoke=smoke, cancel=cancel,
                                           wheels_at=wheels_at, cache_also=[common]) for t in buildable]
                    outcomes += [f.result() for f in futures]
            else:
                for t in buildable:
                    outcome = process(client, project, t, ui, push=push, smoke=smoke, cancel=cancel,
                                      wheels_at=wheels_at)
                    outcomes.append(outcome)
                    if outcome.error and not keep_going:
                        break
        except KeyboardInterrupt:
            cancel.set()
            client.api.close()  # drop the build connections: the engine cancels and cleans up
            raise
        except TargetFailed as exc:
            raise UserError(f"building the shared stage failed: {exc}") from None
    return outcomes
