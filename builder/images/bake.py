"""The matrix as a ``docker-bake.json``, for users who build with ``docker buildx bake``.

One bake target per matrix target and platform: the build ``builder build`` runs
(its plan's request, :mod:`builder.images.plan`: Dockerfile, context ".", the platform's base pin and
each layer's wheels as build arguments, the wheels as one named context per layer), every tag,
the static labels, the cache in from the registry (the target's registry cache, then the published
image's inline record, :func:`builder.images.plan.cache_exports`) and none out, the output in the
target's compression; and the
matrix's groups. ``builder bake`` stages the wheels' folders, so that plain
``docker buildx bake -f docker-bake.json <target>`` builds with no builder process running. A target with several platforms gets one
bake target per platform, ``<name>-<arch>``, tagged ``<tag>-<arch>`` (each platform starts FROM
its own pinned base, which one multi-platform bake target cannot express); ``builder push``
then writes the index under the target's own tags.
Bake names allow only ``[a-zA-Z0-9_-]``, so a dot in a target name becomes ``_``
(amd-rocm5.7 -> amd-rocm5_7); the label ``io.ml-image-builder.target`` keeps the real name.

Example:
    >>> definition = bake_definition(project, project.targets)
    >>> definition["target"]["cpu"]["tags"][0]
    'localhost:5000/ml-runtime:cpu'
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from builder.config.ownership import clone_id
from builder.config.project import Project, Target, TargetView
from builder.images.plan import ViewPlan, cache_ref, make_plan
from builder.oci import buildkit
from builder.wheels import contexts, layers, locks

#: buildx rejects other characters in target and group names.
BAKE_NAME = re.compile(r"[a-zA-Z0-9_-]+")


def bake_name(name: str) -> str:
    """A matrix name as a valid bake name (``.`` and anything else outside the grammar -> ``_``).

    Example:
        >>> bake_name("amd-rocm5.7")
        'amd-rocm5_7'
    """
    return re.sub(r"[^a-zA-Z0-9_-]", "_", name)


def bake_target(project: Project, view: TargetView, planned: ViewPlan | None = None) -> dict[str, Any]:
    """One bake target for a target view: the build ``builder build`` runs (its plan's request,
    :mod:`builder.images.plan`), in bake's vocabulary; the cache comes from the registry (the
    target's registry cache, then the published image)."""
    plan = planned or make_plan(project, [view]).views[0]
    request = replace(plan.request, cache_from=tuple(f"type=registry,ref={ref}"
                                                     for ref in (cache_ref(view), view.primary_ref)))
    return {
        "context": request.context,
        "dockerfile": request.dockerfile,
        "platforms": [request.platform],
        # bake's host may differ (EMULATED); SOURCE_DATE_EPOCH follows the commit, not the matrix
        "args": {k: v for k, v in request.build_args.items() if k not in ("EMULATED", "SOURCE_DATE_EPOCH")},
        "contexts": request.contexts,  # the wheels, one folder per layer (`builder bake` stages them)
        "tags": view.platform_refs or list(view.refs),
        "labels": dict(view.labels),
        "cache-from": list(request.cache_from),
        "cache-to": list(request.cache_to),
        "output": [buildkit.output(request)],  # in the target's compression
    }


def bake_definition(project: Project, targets: Sequence[Target]) -> dict[str, Any]:
    """A docker-bake.json document for *targets*: ``group`` (default, all, the matrix's) and ``target``.

    Groups keep only members among *targets*; a matrix group left empty is dropped
    (``default`` and ``all`` always stay, so ``docker buildx bake`` with no argument works).
    """
    views = {t.name: t.views() for t in targets}
    names = {t.name: [view_name(v) for v in vs] for t, vs in ((project.target(n), vs) for n, vs in views.items())}
    groups: dict[str, dict[str, list[str]]] = {}
    for name in dict.fromkeys(["default", "all", *project.matrix.groups]):
        members = [b for m in project.matrix.group(name) if m in names for b in names[m]]
        if members or name in ("default", "all"):
            groups[bake_name(name)] = {"targets": members}
    planned = {p.unit: p for p in make_plan(project, [v for vs in views.values() for v in vs]).views}
    return {"group": groups, "target": {view_name(v): bake_target(project, v, planned[v.unit])
                                        for vs in views.values() for v in vs}}


def view_name(view: TargetView) -> str:
    """The bake name of a target view: the target's, with ``-<arch>`` when it has several platforms.

    Example:
        >>> view_name(project.target("nvidia-cu130").on("linux/arm64"))
        'nvidia-cu130-arm64'
    """
    return bake_name(view.name + (f"-{view.arch}" if len(view.platforms) > 1 else ""))


def stage_contexts(project: Project, targets: Sequence[Target], say: Callable[[str], object]) -> dict[str, str]:
    """Fetch (by hash) and stage every view's wheels where its bake target's ``contexts`` points;
    return {view's unit: why not} for those whose wheels could not be had."""
    views = [v for t in targets for v in t.views()]
    failed = locks.lock_all(project, views, say)
    for view in views:
        if view.unit not in failed:
            contexts.build_context(layers.context_layers(project, view), clone_id(project.root))
    return failed
