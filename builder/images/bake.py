"""The matrix as a ``docker-bake.json``, for users who build with ``docker buildx bake``.

One bake target per matrix target and platform (same Dockerfile, context ".", the platform's
base pin and each layer's wheels as build arguments, as ``builder build`` passes them, every tag, the static labels), the matrix's groups, registry
cache in (the published image) and inline cache out. A target with several platforms gets one
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
from typing import Any

from builder.config.project import Project, ResolvedTarget
from builder.images import content, wheelserver

#: buildx rejects other characters in target and group names.
BAKE_NAME = re.compile(r"[a-zA-Z0-9_-]+")


def bake_name(name: str) -> str:
    """A matrix name as a valid bake name (``.`` and anything else outside the grammar -> ``_``).

    Example:
        >>> bake_name("amd-rocm5.7")
        'amd-rocm5_7'
    """
    return re.sub(r"[^a-zA-Z0-9_-]", "_", name)


def bake_target(project: Project, target: ResolvedTarget) -> dict[str, Any]:
    """One bake target for a target view: what ``builder build`` passes to the engine, in bake's vocabulary."""
    return {
        "context": ".",
        "dockerfile": target.dockerfile,
        "platforms": [target.platform],
        "args": content.build_args(project, target),  # the base pin, each layer's locked wheels
        "tags": target.platform_refs or list(target.refs),
        "labels": dict(target.labels),
        "cache-from": [f"type=registry,ref={target.primary_ref}"],
        "cache-to": ["type=inline"],
        "network": "host",  # the loopback wheel server...
        "extra-hosts": {wheelserver.HOST: "127.0.0.1"},  # ...under the name the Dockerfiles use
    }


def bake_definition(project: Project, targets: list[ResolvedTarget]) -> dict[str, Any]:
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
    return {"group": groups, "target": {view_name(v): bake_target(project, v) for vs in views.values() for v in vs}}


def view_name(target: ResolvedTarget) -> str:
    """The bake name of a target view: the target's, with ``-<arch>`` when it has several platforms.

    Example:
        >>> view_name(project.target("nvidia-cu130").on("linux/arm64"))
        'nvidia-cu130-arm64'
    """
    return bake_name(target.name + (f"-{target.arch}" if len(target.platforms) > 1 else ""))
