"""Push images to the matrix's registry and record what was published.

Versioned tags go first; the moving ``latest-<vendor>`` alias moves only after every
versioned tag is in and its digest checked. After a push, the digest the registry reports
must equal the one the engine recorded; both go into ``dist/published.json``.

A target with several platforms pushes each platform's image under its content tag and its
platform tags (``<tag>-<arch>``); then one OCI image index, listing every platform whose
current content is in the registry, goes under each of the target's tags, so that a pull on
either architecture gets its own image.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from builder.config.errors import TargetFailed
from builder.config.files import atomic_write, locked, published_path
from builder.config.project import Project, Target, TargetView
from builder.images.content import content_tags
from builder.images.plan import push_order
from builder.oci import registry
from builder.oci.engine import Engine, PushFailed


def push_target(engine: Engine, view: TargetView, image_id: str, refs: Sequence[str]) -> dict[str, Any]:
    """Push the image of a built target view under *refs*, in order; return its published record.

    Example:
        >>> push_target(connect(), cpu, image_id, [content_tag, *image_refs(cpu)])["digest"]  # doctest: +SKIP
        'sha256:...'
    """
    digests: dict[str, str] = {}
    for ref in refs:
        try:
            digests[ref] = engine.push(ref, view.compression)
        except PushFailed as exc:  # the target fails with the push's own line; the others go on
            raise TargetFailed(str(exc)) from None
    unique = set(digests.values())
    if len(unique) != 1:
        raise TargetFailed(f"{view.name}: tags were pushed with different digests {sorted(unique)}")
    digest = unique.pop()
    local = engine.repo_digests(image_id)
    repo = registry.Ref.parse(view.primary_ref).name
    if f"{repo}@{digest}" not in local:
        raise TargetFailed(f"{view.name}: local RepoDigests {local} lack the pushed digest {digest}")
    return published(view, image_id, digest, list(digests))


def published(view: TargetView, image_id: str | None, digest: str, tags: list[str]) -> dict[str, Any]:
    """The dist/published.json record of a target whose *tags* now point at *digest*."""
    repo = registry.Ref.parse(view.primary_ref).name
    return {
        "target": view.unit,
        "platform": view.platform,
        "image_id": image_id,
        "digest": digest,
        "reference": f"{repo}@{digest}",
        "tags": tags,
        "pushed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def push_index(project: Project, target: Target, revision: str) -> tuple[str, dict[str, Any]]:
    """Write one OCI image index under every tag of a multi-platform target; return what was done,
    in a line, and its dist/published.json record (the caller records it, with its attachments).

    The index lists each of the target's platforms whose current content tag (built and
    smoke-tested) the registry has, so runners that build one platform each converge on an
    index listing all of them.
    """

    views = target.views()
    tags = content_tags(project, views)
    creds = registry.credentials(registry.Ref.parse(target.primary_ref).host)
    present = {v.platform: d for v in views if (d := registry.manifest_digest(tags[v.unit], creds)) is not None}
    if not present:
        raise TargetFailed(f"{target.name}: the registry has none of its platforms' content tags; nothing to index")
    missing = [p for p in target.platforms if p not in present]
    digest = ""
    for ref in push_order(target):
        digest = registry.put_index(ref, [(p, present[p]) for p in target.platforms if p in present], creds)
    repo = registry.Ref.parse(target.primary_ref).name
    entry = {"target": target.name, "platform": None, "image_id": None, "digest": digest,
             "reference": f"{repo}@{digest}", "tags": push_order(target), "platforms": present,
             "pushed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "current_revision": revision}
    note = f"; {', '.join(missing)} not in it yet (build it with --platform and --push)" if missing else ""
    return f"{target.name}: index {digest} lists {', '.join(present)} under {len(push_order(target))} tags{note}", entry


def _read(path: Path) -> dict[str, Any]:
    """dist/published.json's records; {} when absent or not a JSON object (damaged: rewritten whole)."""
    try:
        current = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return current if isinstance(current, dict) else {}


def record(root: Path, records: list[dict[str, Any]]) -> Path:
    """Merge records into dist/published.json (one entry per target).

    Threads and processes (a lock file next to it) take turns, so no record is lost.
    """
    path = published_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path.with_name(path.name + ".lock")):
        current = _read(path)
        for rec in records:
            current[rec["target"]] = rec
        atomic_write(path, json.dumps(current, indent=2, sort_keys=True) + "\n")
    return path
