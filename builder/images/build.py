"""``builder build`` and ``builder push``: one pipeline, from the plan to the published index.

One run: the base pinned (:func:`builder.base.pin.get`, the one place ``--update-base`` acts),
the locks and the rendered Dockerfiles (no wheel fetched), the plan, made once
(:mod:`builder.images.plan`: per view its content tag, references, build request and stages), the
lookups of what is already there (:func:`builder.images.lookup.presence`) and a pure decision per
view (:func:`builder.images.plan.decide`); the reused views run their stages first; the others fetch
their wheels, get their platform's base and are built, one by one or ``-j N`` side by side, all by
one executor (:class:`builder.images.execute.Executor`); then, with ``push``, each multi-platform
target's index, whose errors become its views' errors. ``builder push`` is the same pipeline with
the build stages skipped (:func:`builder.images.plan.decide_push`). Every engine request goes
through :class:`builder.oci.engine.Engine`; the CLI only parses options and prints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from builder.base import pin as base
from builder.config import files, platforms
from builder.config.project import Project, TargetView
from builder.gc import stores as gc
from builder.images import plan as plans
from builder.images import render, trust
from builder.images.execute import UI, Attester, Executor
from builder.images.lookup import presence, push_decisions
from builder.images.outcome import Outcome
from builder.oci.engine import Engine
from builder.wheels import locks

__all__ = ["build_all", "push_all", "registry_cache_supported", "run"]


def registry_cache_supported(engine: Engine, builder: str | None = None) -> bool:
    """Whether builds here can export a registry cache: the docker driver can with the containerd
    image store only; a *builder* the user selects (docker-container, remote, kubernetes) always can."""
    return bool(builder) or engine.store() == "containerd"


def build_all(
    engine: Engine,
    project: Project,
    views: Sequence[TargetView],
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
    vouch: trust.Vouch | None = None,
    builder: str | None = None,
) -> list[Outcome]:
    """``builder build``: reuse or build every target view (one per platform); with ``keep_going`` a
    failure doesn't stop the others.

    First, from the committed locks alone (no wheels fetched), each view whose content tag
    exists locally, or in the registry on a digest that counts as smoke-tested (:mod:`builder.images.trust`;
    *vouch*: the cli's signature check), is reused; only the rest fetch wheels, need their
    platform's base and are built. ``rebuild`` builds everything, without the layer cache.
    With ``push``, a target with several platforms then gets one index under each of its tags;
    with *attest* (the cli's, from a signing key), every pushed image and index its attachments. *builder* is
    the buildx builder (``--builder``); None: the engine's own.
    """
    options = plans.Options(push=push, smoke=smoke, rebuild=rebuild, pull=pull, sign=attest is not None,
                            builder=builder)
    return run(engine, project, views, ui, options, keep_going=keep_going, jobs=jobs, update_base=update_base,
               attest=attest, vouch=vouch)


def push_all(engine: Engine, project: Project, views: Sequence[TargetView], ui: UI, *,
             attest: Attester | None = None) -> list[Outcome]:
    """``builder push``: the pipeline without its build stages; every view is tried (keep going)."""
    options = plans.Options(push=True, sign=attest is not None)
    return run(engine, project, views, ui, options, keep_going=True, attest=attest, build=False)


def run(engine: Engine, project: Project, views: Sequence[TargetView], ui: UI, options: plans.Options, *,
        keep_going: bool, jobs: int = 1, update_base: bool = False, attest: Attester | None = None,
        build: bool = True, vouch: trust.Vouch | None = None) -> list[Outcome]:
    """The pipeline (module docstring): its outcomes, one per view, index errors merged in."""
    labels = plans.build_labels(project.root)
    if build:
        project = base.pin(engine, project, list(dict.fromkeys(v.platform for v in views)), update=update_base,
                           say=ui.say)
    if options.push:  # one engine request, not one per target
        options = dataclasses.replace(options, registry_cache=build and registry_cache_supported(engine, options.builder))
    executor = Executor(engine, project, ui, options=options, attest=attest, revision=labels[plans.REVISION])
    if build:
        outcomes = _build(engine, project, views, ui, options, executor, labels, keep_going=keep_going, jobs=jobs,
                          update_base=update_base, vouch=vouch)
    else:
        planned = plans.make_plan(project, views, options, labels=labels)
        outcomes = executor.run(push_decisions(engine, planned.views, options), keep_going=True)
    if options.push:
        why = " (content tags are pushed after a passed smoke test only: drop --no-smoke)" if not options.smoke else ""
        for result in executor.indexes(plans.index_plans(project, views, options), outcomes):
            if result.error is not None:
                error = result.error if result.written else f"no index written under its tags: {result.error}{why}"
                for o in outcomes:
                    if o.target == result.name and not o.error:
                        o.error = error
    return outcomes


def _failed(ui: UI, views: Sequence[TargetView], errors: dict[str, str]) -> list[Outcome]:
    """The outcomes of the views among *views* that failed before building (locks, fetch, emulation)."""
    out = []
    for t in views:
        if t.unit in errors:
            out.append(Outcome(t.name, t.platform, error=errors[t.unit]))
            ui.done(t.unit, out[-1])
    return out


def _build(engine: Engine, project: Project, views: Sequence[TargetView], ui: UI, options: plans.Options,
           executor: Executor, labels: dict[str, str], *, keep_going: bool, jobs: int,
           update_base: bool, vouch: trust.Vouch | None) -> list[Outcome]:
    """Plan once, decide, run the reused views' stages, then fetch, bring the bases and build the rest."""
    root = project.root  # a killed run's temporary files of atomic writes (locks, Dockerfiles, records)
    files.remove_stale_temporaries(root, root / "dist")
    files.remove_stale_temporaries(root / "images", recursive=True)
    failed_locks = locks.lock_all(project, views, ui.say, fetch=False)
    rendered = render.render(project, views)
    render.write(rendered)
    planned = plans.make_plan(project, views, options, labels=labels, rendered=rendered)
    candidates = [p for p in planned.views if p.unit not in failed_locks]
    found = {} if options.rebuild else presence(engine, candidates, vouch)
    decided = {p.unit: plans.decide(p, found.get(p.unit), options) for p in candidates}
    for unit, decision in decided.items():
        if decision.note:
            ui.say(f"{unit}: {decision.note}")
    outcomes, buildable = [], []
    for p in planned.views:  # in order: the failed, the reused, and what is left to build
        if p.unit in failed_locks:
            outcomes += _failed(ui, [p.view], failed_locks)
        elif decided[p.unit].result != "built":
            outcomes.append(executor.run_view(p, decided[p.unit]))
        else:
            buildable.append(p)
    if ((failed_locks or any(o.error for o in outcomes)) and not keep_going) or not buildable:
        return outcomes
    ready, failed = _ready(engine, project, ui, buildable, keep_going=keep_going, update_base=update_base)
    outcomes += failed
    if ready:
        outcomes += executor.run([(p, decided[p.unit]) for p in ready], keep_going=keep_going, jobs=jobs,
                                 shared=ready[0])
        gc.after_build(project, engine)  # this run's staged folders released; those this checkout left behind, a day on
    return outcomes


def _ready(engine: Engine, project: Project, ui: UI, buildable: list[plans.ViewPlan], *, keep_going: bool,
           update_base: bool) -> tuple[list[plans.ViewPlan], list[Outcome]]:
    """(the views that can be built now, the outcomes of those that can't): their wheels fetched and
    their platform's base local; without *keep_going* a failure here builds nothing."""
    failed_fetch = fetch(project, [p.view for p in buildable])
    outcomes = _failed(ui, [p.view for p in buildable], failed_fetch)
    buildable = [p for p in buildable if p.unit not in failed_fetch]
    if failed_fetch and not keep_going:
        return [], outcomes
    for platform in dict.fromkeys(p.view.platform for p in buildable):
        # base.pin checked it can be had, so this pulls it; a registry that lost it since is bootstrapped again
        pinned = base.get(engine, project, platform, need="local", update=update_base, say=ui.say)
        if pinned != project.base_for(platform):  # the registry lost the base during this run
            errors = {p.unit: f"the {platform} base was re-pinned during this run ({pinned}): run it again"
                      for p in buildable if p.view.platform == platform}
            outcomes += _failed(ui, [p.view for p in buildable], errors)
            buildable = [p for p in buildable if p.unit not in errors]
    return buildable, outcomes


def fetch(project: Project, views: Sequence[TargetView]) -> dict[str, str]:
    """Fetch the wheels of *views*; return {unit: why not}. A foreign platform without emulation
    fails now, with the fix, and fetches nothing."""
    failed = {t.unit: problem for t in views if (problem := platforms.emulation_problem(t.platform))}
    failed |= locks.lock_all(project, [t for t in views if t.unit not in failed], lambda line: None)
    return failed
