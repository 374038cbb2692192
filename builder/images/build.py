"""``builder build``: plan, then reuse or build (BuildKit), smoke-test, tag and (optionally) push each target view.

One run is: the locks and the rendered Dockerfiles (no wheel fetched), the plan
(:mod:`builder.images.plan`: per view its content tag, references, build request and stages),
the lookups of what is already there (:func:`builder.images.execute.presence`) and a pure
decision per view (:func:`builder.images.plan.decide`); the reused views run their stages
first; the others fetch their wheels, get their platform's base (re-pinned with
``--update-base``) and are built, one by one or ``-j N`` side by side, all by one executor
(:class:`builder.images.execute.Executor`); then, with ``--push``, each multi-platform target's
index. Builds go through ``docker buildx`` (:mod:`builder.oci.buildkit`); everything else
through docker-py, both behind :class:`builder.oci.engine.Engine`.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from builder.config import files, platforms
from builder.config.project import Project, ResolvedTarget
from builder.images import base, gc, layers, locks, render, wheelhouse
from builder.images import plan as plans
from builder.images.execute import UI, Attester, Executor, presence
from builder.images.outcome import Outcome
from builder.images.plan import cache_ref, registry_cache_sink
from builder.oci import buildkit, registry
from builder.oci.engine import Engine

__all__ = ["build_all", "build_request", "cache_ref", "docker_build", "ensure_base_present",
           "registry_cache_sink", "registry_cache_supported"]


def build_request(
    project: Project, target: ResolvedTarget, *, stage: str | None = None, cache_from: Sequence[str] = (),
    nocache: bool = False, registry_cache: bool = False,
) -> buildkit.BuildRequest:
    """The build of one target view (or one stage of it), as data: what ``builder bake`` writes too.

    The wheels arrive as one named context per layer, ``wheels-<layer>`` (no network); the base pin, each layer's
    wheels and EMULATED (a foreign platform under qemu here) as build arguments; inline cache
    metadata goes into the image, so a runner that lacks it can use the published image as cache.
    With *registry_cache* every step's cache also goes to :func:`cache_ref` (mode=max), which a
    fresh runner then reads first.
    SOURCE_DATE_EPOCH (the commit time, as the ``created`` label) fixes the image config's own
    times, so two runners building one commit from cache make the very same image; BuildKit
    keeps it out of every step's cache key. (:func:`builder.images.plan.request`, with this commit's labels.)
    """
    return plans.request(project, target, plans.build_labels(project.root), stage=stage, cache_from=cache_from,
                         nocache=nocache, registry_cache=registry_cache)


def registry_cache_supported(engine: Engine) -> bool:
    """Whether builds here can export a registry cache: the docker driver can with the containerd
    image store only; a builder the user selects (docker-container, remote, kubernetes) always can."""
    return bool(os.environ.get("BUILDX_BUILDER")) or engine.store() == "containerd"


def docker_build(
    engine: Engine,
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
    """Build one target view (or one stage of it) through BuildKit, alone (no smoke test, no tag);
    return (image ID, steps, steps from cache, the registry caches read)."""
    wheelhouse.build_context(layers.context_layers(project, target))  # the folders the request's contexts name
    request = build_request(project, target, stage=stage, cache_from=cache_from, nocache=nocache,
                            registry_cache=registry_cache)
    host = registry.Ref.parse(target.primary_ref).host
    image_id, result = engine.build(request, on_step=on_step, on_log=on_log, cancel=cancel,
                                               registry_host=host, cwd=project.root)
    return image_id, result.steps, result.cached, result.cache_read


def ensure_base_present(
    engine: Engine, project: Project, platform: str, say: Callable[[str], None], update: bool = False
) -> str:
    """*platform*'s pinned base must be local; bring it (pull, or bootstrap) if not; return its reference.

    With ``update``, a bootstrap that differs from the pin (the Debian mirror moved) is re-pinned,
    and the returned reference is the new one.
    """
    ref = project.base_for(platform)
    if engine.image(ref) is not None:
        return ref
    say(f"base {ref} ({platform}) is not local: fetching it")
    return base.ensure_base(engine, project, platform, update=update, say=say).reference


def build_all(
    engine: Engine,
    project: Project,
    targets: list[ResolvedTarget],
    ui: UI,
    *,
    push: bool = False,
    smoke: bool = True,
    keep_going: bool = False,
    jobs: int = 1,
    rebuild: bool = False,
    pull: bool = False,
    update_base: bool = False,
    attest: Attester | None = None,
) -> list[Outcome]:
    """Reuse or build every target view (one per platform); with ``keep_going`` a failure doesn't stop the others.

    First, from the committed locks alone (no wheels fetched), each view whose content tag
    exists locally or in the registry is reused; only the rest fetch wheels, need their
    platform's base and are built. ``rebuild`` builds everything, without the layer cache.
    With ``push``, a target with several platforms then gets one index under each of its tags;
    with *attest* (the cli's, from a signing key), every pushed image and index its attachments.
    """
    options = plans.Options(push=push, smoke=smoke, rebuild=rebuild, pull=pull, sign=attest is not None)
    run = _Run(engine, project, ui, options, attest, keep_going, plans.build_labels(project.root))
    outcomes = run.reuse_or_build(targets, jobs=jobs, update_base=update_base)
    if push:
        why = " (content tags are pushed after a passed smoke test only: drop --no-smoke)" if not smoke else ""
        for result in run.executor(project).indexes(plans.index_plans(project, targets, options), outcomes):
            if result.error is not None:
                error = result.error if result.written else f"no index written under its tags: {result.error}{why}"
                for o in outcomes:
                    if o.target == result.name and not o.error:
                        o.error = error
    return outcomes


@dataclasses.dataclass
class _Run:
    """One ``build_all``: what its steps share."""

    engine: Engine
    project: Project
    ui: UI
    options: plans.Options
    attest: Attester | None
    keep_going: bool
    labels: dict[str, str]

    def executor(self, project: Project) -> Executor:
        return Executor(self.engine, project, self.ui, options=self.options, attest=self.attest,
                        revision=self.labels[plans.REVISION])

    def failed(self, views: Sequence[ResolvedTarget], errors: dict[str, str]) -> list[Outcome]:
        """The outcomes of the views among *views* that failed before building (locks, fetch, emulation)."""
        out = []
        for t in views:
            if t.unit in errors:
                out.append(Outcome(t.name, t.platform, error=errors[t.unit]))
                self.ui.done(t.unit, out[-1])
        return out

    def reuse_or_build(self, targets: list[ResolvedTarget], *, jobs: int, update_base: bool) -> list[Outcome]:
        root = self.project.root  # a killed run's temporary files of atomic writes (locks, Dockerfiles, records)
        files.remove_stale_temporaries(root, root / "dist")
        files.remove_stale_temporaries(root / "images", recursive=True)
        failed_locks = locks.lock_all(self.project, targets, self.ui.say, fetch=False)
        rendered = render.render(self.project, targets)
        render.write(rendered)
        planned = plans.make_plan(self.project, targets, self.options, labels=self.labels, rendered=rendered)
        candidates = [p for p in planned.views if p.unit not in failed_locks]
        found = {} if self.options.rebuild else presence(self.engine, candidates)
        decided = {p.unit: plans.decide(p, found.get(p.unit), self.options) for p in candidates}
        executor, outcomes, buildable = self.executor(self.project), [], []
        for p in planned.views:  # in order: the failed, the reused, and what is left to build
            if p.unit in failed_locks:
                outcomes += self.failed([p.view], failed_locks)
            elif decided[p.unit].result != "built":
                outcomes.append(executor.run_view(p, decided[p.unit]))
            else:
                buildable.append(p.view)
        if ((failed_locks or any(o.error for o in outcomes)) and not self.keep_going) or not buildable:
            return outcomes
        failed_fetch = fetch(self.project, buildable)
        outcomes += self.failed(buildable, failed_fetch)
        buildable = [t for t in buildable if t.unit not in failed_fetch]
        if (failed_fetch and not self.keep_going) or not buildable:
            return outcomes
        return outcomes + self.build(buildable, {p.unit: p.content_tag for p in planned.views}, rendered,
                                     jobs=jobs, update_base=update_base)

    def build(self, views: list[ResolvedTarget], tags: dict[str, str], rendered: dict[Path, str], *, jobs: int,
              update_base: bool) -> list[Outcome]:
        """Build *views*: their bases first (a re-pin changes BASE, so their content tags), then one by one or side by side."""
        project = pin_bases(self.engine, self.project, views, self.ui.say, update_base)
        options = dataclasses.replace(self.options,  # one engine request, not one per target
                                      registry_cache=self.options.push and registry_cache_supported(self.engine))
        planned = plans.make_plan(project, views, options, labels=self.labels, rendered=rendered,
                                  tags=tags if project is self.project else None)
        work = [(p, plans.decide(p, None, options)) for p in planned.views]
        outcomes = self.executor(project).run(work, keep_going=self.keep_going, jobs=jobs, shared=planned.views[0])
        gc.after_build(project, views)  # the staged folders this checkout left behind, a day on
        return outcomes


def fetch(project: Project, views: Sequence[ResolvedTarget]) -> dict[str, str]:
    """Fetch the wheels of *views*; return {unit: why not}. A foreign platform without emulation
    fails now, with the fix, and fetches nothing."""
    failed = {t.unit: problem for t in views if (problem := platforms.emulation_problem(t.platform))}
    failed |= locks.lock_all(project, [t for t in views if t.unit not in failed], lambda line: None)
    return failed


def pin_bases(engine: Engine, project: Project, views: Sequence[ResolvedTarget], say: Callable[[str], None],
              update: bool) -> Project:
    """*project* with each platform of *views* having its pinned base local (fetched if not); re-pinned
    (builds start FROM the new base) when a bootstrap with *update* moved it."""
    pins = {p: ensure_base_present(engine, project, p, say, update=update)
            for p in dict.fromkeys(t.platform for t in views)}
    if all(project.base_for(p) == ref for p, ref in pins.items()):
        return project
    say(f"re-pinned the base {pins} in base.lock.json; commit it")
    return dataclasses.replace(project, base_refs={**project.base_refs, **pins})
