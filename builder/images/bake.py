"""The matrix as a ``docker-bake.json``, for users who build with ``docker buildx bake``.

One bake target per matrix target (same Dockerfile, context ".", every tag, the static
labels), the matrix's groups, registry cache in (the published image) and inline cache out.
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
from builder.images import wheelserver

#: buildx rejects other characters in target and group names.
BAKE_NAME = re.compile(r"[a-zA-Z0-9_-]+")


def bake_name(name: str) -> str:
    """A matrix name as a valid bake name (``.`` and anything else outside the grammar -> ``_``).

    Example:
        >>> bake_name("amd-rocm5.7")
        'amd-rocm5_7'
    """
    return re.sub(r"[^a-zA-Z0-9_-]", "_", name)


def bake_target(target: ResolvedTarget) -> dict[str, Any]:
    """One bake target: what ``builder build`` passes to the engine, in bake's vocabulary."""
    return {
        "context": ".",
        "dockerfile": target.dockerfile,
        "tags": list(target.refs),
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
    chosen = [t.name for t in targets]
    groups: dict[str, dict[str, list[str]]] = {}
    for name in dict.fromkeys(["default", "all", *project.matrix.groups]):
        members = [bake_name(m) for m in project.matrix.group(name) if m in chosen]
        if members or name in ("default", "all"):
            groups[bake_name(name)] = {"targets": members}
    return {"group": groups, "target": {bake_name(t.name): bake_target(t) for t in targets}}
