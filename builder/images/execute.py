"""The executor: runs each planned view's stages, in order, on an :class:`~builder.oci.engine.Engine`.

A view's stages (:mod:`builder.images.plan`) are ``build`` -> ``smoke`` -> ``tag`` -> ``push``
-> ``attest`` -> ``record``, or the part of them its :class:`~builder.images.plan.Decision`
leaves. A tag only ever points at an image that finished building and passed its smoke test (the
content tag only once tested); an interrupted build leaves the previous tags where they were.
``record`` writes the view's ``dist/published.json`` entry once, attachments included; when a
later stage fails after the push, what was pushed is still recorded. Then each multi-platform
target gets its index (``index`` -> ``attest`` -> ``record``).

``builder build`` and ``builder push`` (:func:`builder.images.build.run`, one pipeline) run the very same
stages, so both publish the same things: the content tag when smoke-tested, the platform tags,
the index, the attachments.

The engine is a parameter (a fake of :class:`~builder.oci.engine.Engine` in the unit tests).
So are the two stages whose code lives elsewhere: the smoke test (:mod:`builder.images.smoke`)
and ``attest``, an
:class:`Attester` that the cli layer makes from :mod:`builder.supply.attach`: the supply chain
is a layer above the images (``cli > supply > images``, pyproject.toml's import contracts), so
images never import it; the cli injects it, and without a signing key there is none and the
stage does nothing.

Example:
    >>> executor = Executor(connect(), project, ui, options=Options())  # doctest: +SKIP
    >>> executor.run([(view, decide(view, None, Options()))], keep_going=False)  # doctest: +SKIP
    [Outcome(target='cpu', ..., result='built', ...)]
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Protocol

from builder.config.errors import TargetFailed, UserError
from builder.config.ownership import clone_id, run_state, run_token
from builder.config.project import Project, Target, TargetView
from builder.config.tags import tag_of
from builder.gc import owned
from builder.images import lookup, publish, smoke, trust
from builder.images import plan as plans
from builder.images.outcome import Outcome
from builder.oci import faults, registry
from builder.oci.engine import BuildRequest, BuildResult, Engine, EngineError
from builder.wheels import contexts, images

#: After an interrupt: how long to wait for the cancelled builds and this run's smoke containers.
CLEANUP_S = 30.0
#: The containerd store's refusal when two builds export one image at once (``failed to solve: image
#: "moby-dangling@sha256:...": already exists``): seen in 1 of 4 rounds of two ``builder build -t cpu``.
EXPORT_RACE = re.compile(r'image "[^"]+": already exists')


class UI(Protocol):
    """What the executor tells: :class:`builder.images.progress.Progress` is one."""

    def start(self, target: str) -> None: ...
    def step(self, target: str, n: int, total: int, text: str) -> None: ...
    def log(self, target: str, line: str) -> None: ...
    def done(self, target: str, outcome: Outcome) -> None: ...
    def say(self, text: str) -> None: ...


class Attester(Protocol):
    """The ``attest`` stage: sign and attach to a pushed image, or sign an index; return
    {kind: referrer digest}. A failure raises TargetFailed (its message is the view's error)."""

    def image(self, view: TargetView, digest: str, content_tag: str | None) -> dict[str, str]: ...
    def index(self, target: Target, digest: str) -> dict[str, str]: ...


class SmokeTest(Protocol):
    """The smoke test (:func:`builder.images.smoke.smoke_test`): a result with ``status``, ``skipped``, ``summary()``."""

    def __call__(self, engine: Engine, project: Project, view: TargetView, image: str, *,
                 log: Callable[[str], None]) -> Any: ...


@dataclass(frozen=True)
class IndexResult:
    """What became of one target's index: *written* under its tags or not, and why not (*error*)."""

    name: str
    written: bool
    error: str | None = None


@dataclass
class _Run:
    """One view while its stages run."""

    plan: plans.ViewPlan
    decision: plans.Decision
    out: Outcome
    present: tuple[str, ...] = ()
    record: dict[str, Any] | None = None
    recorded: bool = False
    held: str | None = None  # the image this run holds in the images ledger (builder.gc.owned)
    contexts: tuple[str, ...] = ()  # the context images it holds there


def remove_smoke_containers(engine: Engine, say: Callable[[str], None] = print, timeout: float = CLEANUP_S) -> None:
    """After an interrupt: force-remove the smoke containers this process started (by their label).

    BuildKit's own step containers are not the engine's: a cancelled build leaves none.
    """

    deadline = time.monotonic() + timeout
    label = f"{smoke.SMOKE_LABEL}={run_token()}"
    while True:
        left = engine.containers(label)
        for cid in left:
            engine.remove_container(cid)
        if not left:
            return
        if time.monotonic() > deadline:
            say(f"{len(left)} smoke containers are still there after {timeout:.0f} s; "
                f"remove them with: docker rm -f {' '.join(c[:12] for c in left)}")
            return
        time.sleep(0.2)


def remove_orphans(engine: Engine, say: Callable[[str], None] = print) -> list[str]:
    """Remove the smoke containers of runs that were killed (SIGKILL, a CI runner's timeout): those
    whose label names a run whose lease is free (:func:`builder.config.ownership.run_state` is
    ``gone``). A live run's, another machine's or another user's (``unknown``: whatever ``/proc``
    shows), and every container without the label stay. Returns their IDs; *say* gets one line
    when there were any."""

    gone = [cid for cid, labels in engine.container_labels(smoke.SMOKE_LABEL).items()
            if run_state(labels.get(smoke.SMOKE_LABEL, "")) == "gone"]
    for cid in gone:
        engine.remove_container(cid)
    if gone:
        say(f"removed {len(gone)} smoke container(s) a killed run left: {' '.join(c[:12] for c in gone)}")
    return gone


def _stage_wheels(engine: Engine, project: Project, plan: plans.ViewPlan,
                  say: Callable[[str], None]) -> tuple[dict[str, str], list[str]]:
    """The build's wheel contexts: the folders the plan names, staged (hard links into the wheelhouse)
    or checked, and served as the engine's images where its builds read those in place
    (:mod:`builder.wheels.images`; the folders when the engine refuses a load); *say* gets a line
    for each folder replaced or image loaded.
    This run holds the folders until :func:`builder.gc.stores.after_build` and the images until the
    view is done (the IDs returned with the contexts, to release): no clean-up removes them while the
    engine reads them."""

    folder = contexts.build_context(plan.wheels, clone_id(project.root), say=say)
    if not engine.serves_image_contexts(plan.request.builder):
        return plan.request.contexts, []
    held: list[str] = []

    def hold(ref: str, image_id: str) -> None:
        owned.record_image(engine, project, image_id, plan.name, [ref], hold=True)
        held.append(image_id)

    try:
        served = images.serve(engine, folder, plan.wheels, plan.platform, say, on_served=hold)
    except EngineError as exc:  # the folders build the same image, only slower
        for image_id in held:
            owned.release_image(engine, image_id)
        say(f"{plan.name}: the engine did not load the wheels as images ({exc}); this build sends their "
            "folders instead")
        return plan.request.contexts, []
    return {name: images.SCHEME + ref for name, (ref, _) in served.items()}, held


class Executor:
    """Runs planned views' stages on *engine*, telling *ui*; see the module's docstring.

    *revision* is the commit this run builds from (each record's ``current_revision``).
    """

    def __init__(self, engine: Engine, project: Project, ui: UI, *, options: plans.Options,
                 attest: Attester | None = None, smoke: SmokeTest = smoke.smoke_test, revision: str = "unknown",
                 cancel: threading.Event | None = None) -> None:
        self.engine, self.project, self.ui, self.options = engine, project, ui, options
        self.attest, self.smoke, self.revision = attest, smoke, revision
        self.cancel = cancel or threading.Event()
        self._orphans_removed = False
        self._stages: dict[str, Callable[[_Run], None]] = {
            plans.BUILD: self._build, plans.SMOKE: self._smoke, plans.PULL: self._pull, plans.TAG: self._tag,
            plans.PUSH: self._push, plans.COPY_TAGS: self._copy_tags, plans.ATTEST: self._attest,
            plans.RECORD: self._record,
        }

    # -- one view ---------------------------------------------------------------------------------

    def run_view(self, plan: plans.ViewPlan, decision: plans.Decision) -> Outcome:
        """Run the stages *decision* leaves for *plan*; never raises for the view's own failures."""
        out = Outcome(plan.name, plan.platform, content_tag=plan.content_tag, result=decision.result,
                      image_id=decision.image_id, digest=decision.digest, smoke=decision.smoke,
                      error=decision.error)
        run = _Run(plan, decision, out, present=decision.present)
        start = time.monotonic()
        self.ui.start(plan.unit)
        try:
            for stage in decision.stages if decision.error is None else ():
                self._stages[stage](run)
        except (TargetFailed, UserError) as exc:
            out.error = str(exc)
        except faults.KNOWN as exc:
            out.error = faults.describe(exc, self.engine).line
        finally:
            if plans.RECORD in decision.stages and run.record is not None and not run.recorded:
                self._record(run)  # what was pushed before a later stage failed
            if run.held is not None:  # tagged and done (or failed): gc may judge it from now on
                owned.release_image(self.engine, run.held)
            for image_id in run.contexts:
                owned.release_image(self.engine, image_id)
        out.seconds = round(time.monotonic() - start, 2)
        self.ui.done(plan.unit, out)
        return out

    def _build(self, run: _Run) -> None:
        plan, out, unit = run.plan, run.out, run.plan.unit
        served, held = _stage_wheels(self.engine, self.project, plan, self.ui.say)
        run.contexts = tuple(held)
        # Early exports only where the wheels' contexts are images: BuildKit keeps a folder context's
        # copy per build session, so each early export would send its layers' wheels once more.
        in_place = all(context.startswith(images.SCHEME) for context in served.values())
        request = replace(plan.request, contexts=served, early_stages=plan.request.early_stages if in_place else (),
                          cache_from=() if plan.request.no_cache else tuple(
                              f"type=registry,ref={ref}" for ref in self._cache_sources(plan)))

        def build(request: BuildRequest) -> tuple[str, BuildResult]:
            return self.engine.build(
                request, cancel=self.cancel, registry_host=plan.registry_host, cwd=self.project.root,
                on_step=lambda n, total, text: self.ui.step(unit, n, total, text),
                on_log=lambda line: self.ui.log(unit, line))

        sources, started = self._wheel_sources(request.contexts), time.time()
        with owned.building(self.engine, plan.name):  # until this run holds the image it exports
            try:
                image_id, result = build(request)
            except TargetFailed as exc:
                if not (refused := EXPORT_RACE.search(str(exc))) or self.cancel.is_set():
                    raise
                # Another build of the same image (two runs at once) exported it at the same moment: the
                # containerd store's export is not atomic (moby/moby#46990). Once more, from the layers
                # just built (so with --rebuild too), and the export finds the record there.
                self.ui.say(f"{unit}: {refused[0]}: another build exported the same image "
                            f"at the same moment; exporting it again, from the layers just built")
                image_id, result = build(replace(request, no_cache=False))
            owned.record_image(self.engine, self.project, image_id, plan.name, hold=True)
            run.held = image_id
        if sources is not None:
            with contextlib.suppress(*faults.KNOWN, OSError):  # a record missed is a copy gc never prunes: no harm
                owned.record_wheel_sources(self.engine, self.project, request.contexts, sources, since=started)
        out.image_id, out.steps, out.cached_steps, out.cache_read = image_id, result.steps, result.cached, \
            result.cache_read
        out.phases = dict(result.phases)
        out.result = "built"
        if self.cancel.is_set():
            raise TargetFailed("interrupted")
        out.size_bytes = self.engine.size(image_id)

    def _wheel_sources(self, contexts: Iterable[str]) -> dict[str, tuple[Any, Any]] | None:
        """BuildKit's copies of the wheel *contexts* before a build (:func:`builder.gc.owned.wheel_sources`);
        None when the engine can't say."""
        try:
            return owned.wheel_sources(self.engine, contexts)
        except faults.KNOWN:
            return None

    def _cache_sources(self, plan: plans.ViewPlan) -> list[str]:
        """On a fresh runner, the first of the plan's cache sources the registry has (BuildKit reads
        it itself, layer by layer as needed: nothing is pulled first); [] when the image is here
        already (BuildKit's own cache covers it)."""
        if self.engine.image(plan.local_refs[0]) is not None:
            return []
        for ref in plan.cache_sources:
            if found := lookup.registry_cache_source(ref):
                return found
        return []

    def _smoke(self, run: _Run) -> None:
        out, unit = run.out, run.plan.unit
        if not self._orphans_removed:  # once per run, before its first smoke container
            self._orphans_removed = True
            remove_orphans(self.engine, self.ui.say)
        self.ui.step(unit, out.steps, out.steps, "smoke test")
        result = self.smoke(self.engine, self.project, run.plan.view, out.image_id or "",
                            log=lambda s: self.ui.log(unit, s))
        out.smoke, out.notes = result.status, list(result.skipped)
        if result.status == "failed":
            raise TargetFailed(f"smoke test failed: {result.summary()}")

    def _pull(self, run: _Run) -> None:
        """Pull the digest the lookup found tested (never the tag, which may have moved since), then
        give it its content tag."""
        ref = run.plan.content_tag
        pinned = f"{registry.Ref.parse(ref).name}@{run.decision.digest}"
        self.engine.pull(pinned, registry.credentials(registry.Ref.parse(ref).host))
        image = self.engine.image(pinned)
        if image is None:
            raise TargetFailed(f"pulled {pinned}, yet the engine has no image of that name")
        if ref not in image.tags:
            self._tag_ref(image.id, ref)
        run.out.image_id, run.present = image.id, (*image.tags, ref)

    def _tag(self, run: _Run) -> None:
        """The local tags; the content tag too after a passed smoke test (its presence is the proof)."""
        out, image = run.out, run.out.image_id or ""
        tested = [run.plan.content_tag] if plans.SMOKE in run.decision.stages else []
        for ref in [*tested, *run.plan.local_refs]:
            if ref not in run.present:
                self._tag_ref(image, ref)
        # Built, pulled or reused by this clone: recorded as the builder's, used now, with the tags it gave
        # (a reused image built before the ledger is adopted here).
        owned.record_image(self.engine, self.project, image, run.plan.name, [*tested, *run.plan.local_refs])
        if out.size_bytes is None:
            out.size_bytes = self.engine.size(image)
        out.tags = [tag_of(r) for r in run.plan.local_refs]

    def _tag_ref(self, image: str, ref: str) -> None:
        """Tag; when another build tags the same name at the same moment, the containerd store refuses
        one (``failed to create an image ... after deleting the existing one: ... already exists``,
        moby/moby#46990): done if the name now is this image, else tagged once more."""
        for attempt in range(3):
            try:
                self.engine.tag(image, ref)
                return
            except faults.KNOWN as exc:
                if "already exists" not in str(exc) or attempt == 2:
                    raise
                found = self.engine.image(ref)
                if found is not None and found.id == image:
                    return
                time.sleep(0.2)

    def _push(self, run: _Run) -> None:
        out, plan = run.out, run.plan
        self.ui.step(plan.unit, out.steps, out.steps, "push")
        tested = [plan.content_tag] if out.smoke != "skipped" and plan.content_tag else []
        image = out.image_id or ""
        if registry.is_local(plan.registry_host):  # builder push too: never to what holds the port
            lookup.answers(plan.registry_host)
        pushed = publish.push_target(self.engine, plan.view, image, [*tested, *plan.push_refs])
        out.digest = pushed["digest"]
        if tested:  # what a later build may reuse from the registry (builder.images.trust)
            trust.record(plan.content_tag, out.digest)
        revision = self.engine.labels(image).get(plans.REVISION)
        run.record = {**pushed, "content_tag": plan.content_tag, "result": out.result, "revision": revision,
                      "current_revision": self.revision}

    def _copy_tags(self, run: _Run) -> None:
        """Move the tags of an image the registry has in the registry itself: no pull needed."""
        out, plan = run.out, run.plan
        source = registry.Ref.parse(plan.content_tag)
        if registry.is_local(source.host):
            lookup.answers(source.host)
        creds = registry.credentials(source.host)
        for ref in plan.push_refs:  # from the digest found tested, never the tag (it may have moved since)
            registry.copy_tag(f"{source.name}@{out.digest}", tag_of(ref), creds)
        run.record = {**publish.published(plan.view, None, out.digest or "", list(plan.push_refs)),
                      "content_tag": plan.content_tag, "result": out.result, "revision": None,
                      "current_revision": self.revision}
        out.tags = [tag_of(r) for r in plan.push_refs]

    def _attest(self, run: _Run) -> None:
        if self.attest is None or run.record is None:
            return
        run.record["attachments"] = self.attest.image(run.plan.view, run.out.digest or "", run.plan.content_tag)

    def _record(self, run: _Run) -> None:
        if run.record is not None:
            publish.record(self.project.root, [run.record])
            run.recorded = True

    # -- many views -------------------------------------------------------------------------------

    def run(self, work: Sequence[tuple[plans.ViewPlan, plans.Decision]], *, keep_going: bool, jobs: int = 1,
            shared: plans.ViewPlan | None = None) -> list[Outcome]:
        """Run every view of *work*; without *keep_going* none starts after one failed. With *jobs* > 1,
        *shared*'s shared stage is built once first, then the views side by side on a warm cache.

        Ctrl-C cancels the running builds (each buildx gets SIGINT), waits for them, removes this
        run's smoke containers and raises KeyboardInterrupt again.
        """
        halt = threading.Event()
        futures: list[Future[Outcome | None]] = []

        def one(plan: plans.ViewPlan, decision: plans.Decision) -> Outcome | None:
            if self.cancel.is_set() or halt.is_set():
                return None  # not started: interrupted, or a view failed without --keep-going
            try:
                outcome = self.run_view(plan, decision)
            except Exception as exc:  # noqa: BLE001 - one line in its outcome, never re-raised from f.result()
                outcome = Outcome(plan.name, plan.platform, content_tag=plan.content_tag,
                                  error=faults.describe(exc, self.engine).line)
            if outcome.error and not keep_going:
                halt.set()
            return outcome

        outcomes: list[Outcome] = []
        try:
            if jobs > 1 and len(work) > 1:
                if shared is not None:
                    self._shared_stage(shared)
                pool = ThreadPoolExecutor(max_workers=jobs)
                try:
                    for plan, decision in work:  # one by one: an interrupt sees every future submitted so far
                        futures.append(pool.submit(one, plan, decision))
                    outcomes = [o for f in futures if (o := f.result()) is not None]
                finally:
                    pool.shutdown(wait=False, cancel_futures=True)  # an interrupt must not wait for builds
            else:
                for plan, decision in work:
                    if (outcome := one(plan, decision)) is None:
                        break
                    outcomes.append(outcome)
        except KeyboardInterrupt:
            # Each running build's buildx gets SIGINT (BuildKit cancels it: no step container stays);
            # wait for the workers, then remove the smoke containers this run started.
            self.cancel.set()
            deadline = time.monotonic() + CLEANUP_S
            while any(not f.done() for f in futures) and time.monotonic() < deadline:
                time.sleep(0.1)
            remove_smoke_containers(self.engine, say=self.ui.say)
            raise
        return outcomes

    def _shared_stage(self, plan: plans.ViewPlan) -> None:
        self.ui.say("building the shared stage once")
        held: list[str] = []
        try:
            served, held = _stage_wheels(self.engine, self.project, plan, self.ui.say)
            request = replace(plans.shared_stage(plan), contexts=served)
            with owned.building(self.engine, "common"):  # an untagged image: the builder's, gc's once built
                image_id, _ = self.engine.build(request, cancel=self.cancel, registry_host=plan.registry_host,
                                                cwd=self.project.root, on_log=lambda line: self.ui.log("common", line))
                owned.record_image(self.engine, self.project, image_id, "common")
        except TargetFailed as exc:
            raise UserError(f"building the shared stage failed: {exc}") from None
        finally:
            for image_id in held:
                owned.release_image(self.engine, image_id)

    # -- indexes ----------------------------------------------------------------------------------

    def indexes(self, planned: Sequence[plans.IndexPlan], outcomes: Sequence[Outcome]) -> list[IndexResult]:
        """Write the index of each multi-platform target with a platform published in this run,
        attest it (with a key) and record it, once."""
        results = []
        for index in planned:
            if any(o.target == index.name and not o.error for o in outcomes):
                results.append(self._index(index))
        return results

    def _index(self, index: plans.IndexPlan) -> IndexResult:
        try:
            line, entry = publish.push_index(self.project, index.target, self.revision)
        except TargetFailed as exc:  # its platform images are in; its own tags are not moved
            return IndexResult(index.name, written=False, error=str(exc))
        self.ui.say(line)
        error = None
        if plans.ATTEST in index.stages and self.attest is not None:
            try:
                entry["attachments"] = self.attest.index(index.target, entry["digest"])
            except (TargetFailed, UserError) as exc:
                error = str(exc)
        publish.record(self.project.root, [entry])
        return IndexResult(index.name, written=True, error=error)
