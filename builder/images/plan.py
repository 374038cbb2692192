"""The plan of a build: per target view, everything that is decided without the engine or a registry.

:func:`make_plan` turns the selected target views and the run's :class:`Options` into one
:class:`ViewPlan` each (platform, content tag, references, the build request: build arguments,
named contexts, cache export, labels; and the ordered stages of its build) and one
:class:`IndexPlan` per multi-platform target. ``builder print`` shows it, ``builder bake``
writes its build requests, and :mod:`builder.images.execute` runs it.

Whether a view is built at all needs two lookups (is its content tag local? does the registry
have it?): :func:`builder.images.lookup.presence` makes them and hands back their answers as
data, one :class:`Presence` per view, and :func:`decide`, a pure function of the plan, that
answer and the options, says what happens: built, reused-local (only the tags move),
reused-registry (skipped, pulled, or its tags moved in the registry itself; only an image whose
digest counts as smoke-tested: :mod:`builder.images.trust`), with the stages that leaves. ``builder push`` decides with :func:`decide_push`.

The stages, in the order they run: ``build`` -> ``smoke`` -> ``tag`` -> ``push`` -> ``attest``
-> ``record`` (``pull`` before ``tag`` for a pulled image, ``copy-tags`` instead of ``push``
for one the registry has). ``record`` writes the view's ``dist/published.json`` entry once,
with its attachments.

Example:
    >>> views = make_plan(project, project.target("cpu").views(), Options(push=True)).views
    >>> views[0].stages
    ('build', 'smoke', 'tag', 'push', 'record')
    >>> decide(views[0], Presence(local_id="sha256:ab"), Options(push=True)).stages
    ('tag', 'push', 'record')
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from builder.config.project import Project, Target, TargetView
from builder.config.tags import cache_tag, repository_of
from builder.images import content, trust
from builder.oci import buildkit, registry
from builder.oci.engine import BuildRequest
from builder.oci.secrets import GIT, child_env
from builder.wheels import contexts, layers
from builder.wheels.lockfile import Pin

BUILD, SMOKE, PULL, TAG, PUSH, COPY_TAGS, ATTEST, RECORD, INDEX = (
    "build", "smoke", "pull", "tag", "push", "copy-tags", "attest", "record", "index")
#: The label holding the commit an image was built from (``-dirty`` when the tree was).
REVISION = "org.opencontainers.image.revision"
CREATED = "org.opencontainers.image.created"


@dataclass(frozen=True)
class Options:
    """What the run was asked for: ``build --push --no-smoke --rebuild --pull``, a signing key,
    and whether builds export a registry cache (one engine request per run, asked by the caller)."""

    push: bool = False
    smoke: bool = True
    rebuild: bool = False
    pull: bool = False
    sign: bool = False
    registry_cache: bool = False
    #: the buildx builder builds run on (``--builder``, else BUILDX_BUILDER); None: the engine's own
    builder: str | None = None


@dataclass(frozen=True)
class ViewPlan:
    """One target view (one platform of a target), planned."""

    view: TargetView = field(repr=False, compare=False)
    #: ``<registry>:<target>-<12 hex>``: this exact content (:mod:`builder.images.content`)
    content_tag: str
    #: the tags the image gets in the local engine
    local_refs: tuple[str, ...]
    #: the tags its image is pushed under, in order (aliases last; platform tags for a multi-platform target)
    push_refs: tuple[str, ...]
    #: where a build without the image reads cache from, the first the registry has: the
    #: ``--push`` registry cache, then the published image
    cache_sources: tuple[str, ...]
    #: the registry the view publishes to (BuildKit reads the base and the cache from it)
    registry_host: str
    #: the wheels of the named contexts ``wheels-<layer>``, layer by layer (the build stages their folders)
    wheels: Mapping[str, Sequence[Pin]] = field(repr=False)
    #: the build (cache sources are chosen when it runs: they depend on what is there)
    request: BuildRequest
    #: the stages of building it
    stages: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.view.name

    @property
    def unit(self) -> str:
        return self.view.unit

    @property
    def platform(self) -> str:
        return self.view.platform


@dataclass(frozen=True)
class IndexPlan:
    """The OCI image index of a multi-platform target, written after its platforms' images."""

    target: Target = field(repr=False, compare=False)
    refs: tuple[str, ...]
    platforms: tuple[str, ...]
    stages: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.target.name


@dataclass(frozen=True)
class Plan:
    views: tuple[ViewPlan, ...]
    indexes: tuple[IndexPlan, ...]


@dataclass(frozen=True)
class Presence:
    """The answers of the lookups :func:`decide` needs, for one view: the engine's ID of its content
    tag (None: not local) with the tags already on that image, the registry's digest of it (None:
    absent, or no registry answers) and whether that digest counts as smoke-tested
    (:func:`builder.images.trust.tested`), or why the lookup failed."""

    local_id: str | None = None
    local_tags: tuple[str, ...] = ()
    registry_digest: str | None = None
    registry_tested: bool = False
    error: str | None = None


@dataclass(frozen=True)
class Decision:
    """What happens to one view: its result and the stages left to run, with what they start from."""

    result: str | None
    stages: tuple[str, ...]
    image_id: str | None = None
    digest: str | None = None
    #: local tags already on the image (not moved again)
    present: tuple[str, ...] = ()
    #: what the outcome says of the smoke test before any stage runs
    smoke: str = "skipped"
    error: str | None = None
    #: a line to say before it runs (why it is built)
    note: str | None = None


def cache_ref(view: TargetView) -> str:
    """Where ``--push`` keeps a target view's BuildKit cache: a tag beside its images.

    Example:
        >>> cache_ref(project.target("nvidia-cu130").on("linux/arm64"))
        'localhost:5000/ml-runtime:buildcache-nvidia-cu130-arm64'
    """
    return cache_tag(repository_of(view.primary_ref), view.name, view.arch)


def registry_cache_sink(view: TargetView) -> str:
    """``--cache-to`` for :func:`cache_ref`: every step (mode=max), in the target's compression."""
    return f"type=registry,ref={cache_ref(view)},mode=max,{buildkit.compression_options(view.compression)}"


def cache_exports(view: TargetView, *, registry_cache: bool, push: bool) -> tuple[str, ...]:
    """``--cache-to`` of a build: the registry cache where it serves, else, for a push, BuildKit's inline record.

    The inline record (``moby.buildkit.cache.v0`` in the image's configuration) holds each layer's
    wall-clock creation time, so two cold builds never write the same one and an image that carries
    it has a digest no other machine reproduces. So it goes only where it is the one cache a fresh
    runner can read: a push without a registry cache (the classic store's docker driver). Builds
    that are not pushed write none, so a build of a commit gives the same image ID on every machine
    (what ``builder verify --rebuild`` relies on); ``builder push`` of such an image publishes no
    cache (``build --push`` publishes the registry cache too).

    Example:
        >>> cache_exports(project.target("cpu").on("linux/amd64"), registry_cache=False, push=True)
        ('type=inline',)
        >>> cache_exports(project.target("cpu").on("linux/amd64"), registry_cache=False, push=False)
        ()
    """
    if registry_cache:
        return (registry_cache_sink(view),)
    return ("type=inline",) if push else ()


def push_order(target: Target) -> list[str]:
    """The target's references, versioned tags first and the moving aliases last.

    Example:
        >>> push_order(project.target("cpu"))[-1]
        'localhost:5000/ml-runtime:latest-cpu'
    """
    return [r for r in target.refs if r not in target.alias_refs] + target.alias_refs


def image_refs(view: TargetView) -> list[str]:
    """The tags a target view's own image is pushed under: the target's (aliases last) when it has
    one platform; its platform tags when it has several (the target's tags become an index)."""
    return view.platform_refs or push_order(view)


def wheels_folder(wheels: Mapping[str, Sequence[Pin]]) -> Path:
    """The folder these layers' wheels are staged in, one folder per layer (nothing is written:
    :func:`builder.wheels.contexts.build_context` stages it)."""

    return contexts.context_folder(wheels)


def wheel_contexts(wheels: Mapping[str, Sequence[Pin]]) -> dict[str, str]:
    """The build's named contexts for these layers' wheels: ``wheels-<layer>`` each
    (:func:`builder.wheels.layers.context_name`), that layer's folder of :func:`wheels_folder`.

    Example:
        >>> contexts = wheel_contexts({"tools": [], "cuda-dnn": []})
        >>> list(contexts), Path(contexts["wheels-cuda-dnn"]).name
        (['wheels-tools', 'wheels-cuda-dnn'], 'cuda-dnn')
    """

    folder = wheels_folder(wheels)
    return {layers.context_name(layer): str(folder / layer) for layer in wheels}


def request(
    project: Project, view: TargetView, labels: Mapping[str, str], *, stage: str | None = None,
    cache_from: Sequence[str] = (), nocache: bool = False, registry_cache: bool = False, push: bool = False,
    wheels: Mapping[str, Sequence[Pin]] | None = None, builder: str | None = None,
) -> BuildRequest:
    """The build of one target view (or one stage of it), as data: what the executor builds and ``builder bake`` writes.

    *labels* are the commit's (revision, created); SOURCE_DATE_EPOCH is the commit time. *wheels*
    (the view's :func:`builder.wheels.layers.context_layers`, when the caller has them) name the
    wheel contexts. *builder* is the buildx builder (None: the engine's own).
    """

    epoch = int(datetime.fromisoformat(labels[CREATED]).timestamp())
    return BuildRequest(
        dockerfile=view.dockerfile,
        context=".",
        platform=view.platform,
        build_args={**content.build_args(project, view), **({} if view.native else {"EMULATED": "1"}),
                    "SOURCE_DATE_EPOCH": str(epoch)},
        contexts=wheel_contexts(layers.context_layers(project, view) if wheels is None else wheels),  # staged by the build
        labels={} if stage else dict(labels),
        stage=stage,
        early_stages=() if stage else layers.early_stages(view.layers),
        cache_from=tuple(f"type=registry,ref={ref}" for ref in cache_from),
        cache_to=cache_exports(view, registry_cache=registry_cache, push=push),
        no_cache=nocache,
        builder=builder,
        compression=view.compression,
    )


def shared_stage(plan: ViewPlan) -> BuildRequest:
    """The build of the shared stage (``common``) that ``-j N`` runs once before the targets."""
    return replace(plan.request, stage="common", labels={}, cache_from=(), cache_to=("type=inline",),
                   no_cache=False)


def publish_stages(options: Options) -> tuple[str, ...]:
    """The stages after ``tag`` for an image that is local: push, attest (with a key), record."""
    return (PUSH, *((ATTEST,) if options.sign else ()), RECORD) if options.push else ()


def build_stages(options: Options) -> tuple[str, ...]:
    """The stages of a view that is built.

    Example:
        >>> build_stages(Options(push=True, smoke=False, sign=True))
        ('build', 'tag', 'push', 'attest', 'record')
    """
    return (BUILD, *((SMOKE,) if options.smoke else ()), TAG, *publish_stages(options))


def plan_view(project: Project, view: TargetView, content_tag: str, options: Options,
              labels: Mapping[str, str]) -> ViewPlan:
    """The plan of one target view whose content tag is *content_tag*."""

    wheels = layers.context_layers(project, view)
    return ViewPlan(
        view=view,
        content_tag=content_tag,
        local_refs=tuple(view.local_refs),
        push_refs=tuple(image_refs(view)),
        cache_sources=(cache_ref(view), view.local_refs[0]),
        registry_host=registry.Ref.parse(view.primary_ref).host,
        wheels=wheels,
        request=request(project, view, labels, nocache=options.rebuild, registry_cache=options.registry_cache,
                        push=options.push, wheels=wheels, builder=options.builder),
        stages=build_stages(options),
    )


def build_labels(root: Path) -> dict[str, str]:
    """Labels that vary per commit, applied at build time (not rendered, so images/ stays stable).

    ``created`` is the commit time, not the wall clock, so a no-op rebuild stays a cache hit.
    """

    def git(*args: str) -> str:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False,
                              env=child_env(GIT))
        return proc.stdout.strip() if proc.returncode == 0 else ""

    revision = git("rev-parse", "HEAD") or "unknown"
    if revision != "unknown" and git("status", "--porcelain", "--untracked-files=no"):
        revision += "-dirty"  # never claim a commit the image was not built from
    created = git("log", "-1", "--format=%cI") or "1970-01-01T00:00:00Z"
    return {"org.opencontainers.image.revision": revision, "org.opencontainers.image.created": created}


def make_plan(
    project: Project, views: Sequence[TargetView], options: Options = Options(), *,
    labels: Mapping[str, str] | None = None, tags: Mapping[str, str] | None = None,
    rendered: dict[Path, str] | None = None,
) -> Plan:
    """The plan of *views*: one :class:`ViewPlan` each, in order, and with ``push`` one
    :class:`IndexPlan` per target among them with several platforms.

    *labels* are the commit's (default: :func:`build_labels`, one git call);
    *tags* the content tags when known (default: computed from *rendered*, else images/).
    """

    if labels is None:
        labels = build_labels(project.root)
    if tags is None:
        tags = content.content_tags(project, list(views), rendered)
    planned = tuple(plan_view(project, v, tags[v.unit], options, labels) for v in views)
    return Plan(planned, index_plans(project, views, options))


def index_plans(project: Project, views: Sequence[TargetView], options: Options) -> tuple[IndexPlan, ...]:
    """With ``push``, one :class:`IndexPlan` per target among *views* with several platforms.

    Example:
        >>> [i.refs[0] for i in index_plans(project, project.target("nvidia-cu130").views(), Options(push=True))]
        ['localhost:5000/ml-runtime:nvidia-cu130']
    """
    if not options.push:
        return ()
    targets = [project.target(name) for name in dict.fromkeys(v.name for v in views if len(v.platforms) > 1)]
    return tuple(IndexPlan(target=t, refs=tuple(push_order(t)), platforms=tuple(t.platforms),
                           stages=(INDEX, *((ATTEST,) if options.sign else ()), RECORD)) for t in targets)


def decide(plan: ViewPlan, presence: Presence | None, options: Options) -> Decision:
    """What ``builder build`` does with a view, from what the lookups found (None: none made, as with
    ``--rebuild``): reuse the local image (only its tags move), reuse the registry's when its digest
    counts as smoke-tested (skip it; pull it with ``pull``; move its tags in the registry with
    ``push``), or build it.

    Example:
        >>> p = make_plan(project, project.target("cpu").views()).views[0]
        >>> decide(p, Presence(registry_digest="sha256:cd", registry_tested=True), Options(push=True, sign=True)).stages
        ('copy-tags', 'attest', 'record')
        >>> decide(p, Presence(registry_digest="sha256:cd"), Options(push=True)).result  # found, never tested
        'built'
        >>> decide(p, Presence(), Options()).result
        'built'
    """
    if presence is None:
        return Decision("built", plan.stages)
    if presence.error is not None:
        return Decision(None, (), error=presence.error)
    if presence.local_id is not None:
        return Decision("reused-local", (TAG, *publish_stages(options)), image_id=presence.local_id,
                        present=presence.local_tags, smoke="passed earlier")
    if presence.registry_digest is not None and not presence.registry_tested:
        return Decision("built", plan.stages, note=trust.untested_note(plan.content_tag, presence.registry_digest))
    if presence.registry_digest is not None:
        if options.pull:
            stages: tuple[str, ...] = (PULL, TAG, *publish_stages(options))
        elif options.push:
            stages = (COPY_TAGS, *((ATTEST,) if options.sign else ()), RECORD)
        else:
            stages = ()  # known good in the registry; nothing local to tag
        return Decision("reused-registry", stages, digest=presence.registry_digest, smoke="passed earlier")
    return Decision("built", plan.stages)


def decide_push(plan: ViewPlan, image_id: str | None, tested: bool, options: Options) -> Decision:
    """What ``builder push`` does with a view built earlier: push its local image (*image_id*; None:
    there is none), with its content tag when *tested* (the content tag is on that very image).

    Example:
        >>> p = make_plan(project, project.target("cpu").views()).views[0]
        >>> decide_push(p, "sha256:ab", True, Options(push=True)).stages
        ('push', 'record')
        >>> decide_push(p, None, False, Options(push=True)).error
        'no local image localhost:5000/ml-runtime:cpu; build it first'
    """
    if image_id is None:
        return Decision(None, (), error=f"no local image {plan.local_refs[0]}; build it first")
    return Decision("pushed", publish_stages(replace(options, push=True)), image_id=image_id,
                    smoke="passed earlier" if tested else "skipped")
