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

import fcntl
import json
import threading
import time
from pathlib import Path
from typing import Any

import docker

from builder.config.errors import TargetFailed
from builder.config.files import atomic_write, published_path
from builder.config.project import Project, ResolvedTarget
from builder.oci import registry


def push_ref(client: docker.DockerClient, ref: str) -> str:
    """Push one tag; return the manifest digest the registry reports for it.

    Example:
        >>> push_ref(client, "localhost:5000/ml-runtime:cpu")  # doctest: +SKIP
        'sha256:...'
    """
    r = registry.Ref.parse(ref)
    creds = registry.credentials(r.host)
    digest = None
    try:
        for event in client.api.push(r.name, tag=r.tag, auth_config=creds, stream=True, decode=True):
            if "error" in event:
                raise TargetFailed(_explain(r.host, event["error"]))
            digest = (event.get("aux") or {}).get("Digest", digest)
    except docker.errors.APIError as exc:
        raise TargetFailed(_explain(r.host, exc.explanation or str(exc))) from None
    except docker.errors.DockerException as exc:
        raise TargetFailed(f"push of {ref} failed: {exc}") from None
    reported = registry.manifest_digest(ref, creds)
    if digest is None:  # the containerd image store reports none: the local image's names say it
        digest = reported if reported and f"{r.name}@{reported}" in _repo_digests(client, ref) else None
        if digest is None:
            raise TargetFailed(f"push of {ref}: the registry has {reported}, which the engine does not know "
                               "as this image (another push to the same tag?); push again")
    if reported != digest:
        raise TargetFailed(f"push of {ref}: registry reports {reported}, the engine pushed {digest}")
    return digest


def _repo_digests(client: docker.DockerClient, ref: str) -> list[str]:
    try:
        return list(client.api.inspect_image(ref).get("RepoDigests") or [])
    except docker.errors.ImageNotFound:
        return []


def _explain(host: str, error: str) -> str:
    text = error.strip().splitlines()[0][:200]
    lowered = text.lower()
    if any(word in lowered for word in ("unauthorized", "authentication required", "denied", "no basic auth")):
        return (
            f"registry {host} refused the push ({text}); log in with 'docker login {host}' "
            "or set BUILDER_REGISTRY_USER and BUILDER_REGISTRY_PASSWORD"
        )
    if "connection refused" in lowered or "no such host" in lowered or "dial tcp" in lowered:
        return f"registry {host} is unreachable ({text}); start it or fix 'registry' in matrix.yaml"
    return f"push to {host} failed: {text}"


def image_refs(target: ResolvedTarget) -> list[str]:
    """The tags a target view's own image is pushed under: the target's (aliases last) when it has
    one platform; its platform tags when it has several (the target's tags become an index)."""
    return target.platform_refs or push_order(target)


def push_target(client: docker.DockerClient, target: ResolvedTarget, image_id: str, refs: list[str]) -> dict[str, Any]:
    """Push the image of a built target view under *refs*, in order; return its published record.

    Example:
        >>> push_target(client, cpu, image_id, [content_tag, *image_refs(cpu)])["digest"]  # doctest: +SKIP
        'sha256:...'
    """
    digests: dict[str, str] = {}
    for ref in refs:
        digests[ref] = push_ref(client, ref)
    unique = set(digests.values())
    if len(unique) != 1:
        raise TargetFailed(f"{target.name}: tags were pushed with different digests {sorted(unique)}")
    digest = unique.pop()
    local = client.api.inspect_image(image_id).get("RepoDigests", [])
    repo = registry.Ref.parse(target.primary_ref).name
    if f"{repo}@{digest}" not in local:
        raise TargetFailed(f"{target.name}: local RepoDigests {local} lack the pushed digest {digest}")
    return published(target, image_id, digest, list(digests))


def push_order(target: ResolvedTarget) -> list[str]:
    """The target's references, versioned tags first and the moving aliases last."""
    return [r for r in target.refs if r not in target.alias_refs] + target.alias_refs


def published(target: ResolvedTarget, image_id: str | None, digest: str, tags: list[str]) -> dict[str, Any]:
    """The dist/published.json record of a target whose *tags* now point at *digest*."""
    repo = registry.Ref.parse(target.primary_ref).name
    return {
        "target": target.unit,
        "platform": target.platform,
        "image_id": image_id,
        "digest": digest,
        "reference": f"{repo}@{digest}",
        "tags": tags,
        "pushed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def push_index(project: Project, target: ResolvedTarget, revision: str) -> str:
    """Write one OCI image index under every tag of a multi-platform target; return what was done, in a line.

    The index lists each of the target's platforms whose current content tag (built and
    smoke-tested) the registry has, so runners that build one platform each converge on an
    index listing all of them.
    """
    from builder.images.content import content_tags

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
    record(project.root, [{"target": target.name, "platform": None, "image_id": None, "digest": digest,
                           "reference": f"{repo}@{digest}", "tags": push_order(target), "platforms": present,
                           "pushed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "current_revision": revision}])
    note = f"; {', '.join(missing)} not in it yet (build it with --platform and --push)" if missing else ""
    return f"{target.name}: index {digest} lists {', '.join(present)} under {len(push_order(target))} tags{note}"


#: Serialises record()'s read-change-write between this process's threads (``build -j``).
_RECORD_LOCK = threading.Lock()


def record(root: Path, records: list[dict[str, Any]]) -> Path:
    """Merge records into dist/published.json (one entry per target).

    Threads and processes (a lock file next to it) take turns, so no record is lost.
    """
    path = published_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _RECORD_LOCK, open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        current = json.loads(path.read_text()) if path.exists() else {}
        for rec in records:
            current[rec["target"]] = rec
        atomic_write(path, json.dumps(current, indent=2, sort_keys=True) + "\n")
    return path


def amend(root: Path, key: str, fields: dict[str, Any]) -> None:
    """Add *fields* to the dist/published.json record of *key* (a target view's unit or a target's name), if any.

    Example:
        >>> amend(project.root, "cpu", {"attachments": {"sig": "sha256:..."}})
    """
    path = published_path(root)
    if not path.exists():
        return
    with _RECORD_LOCK, open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current = json.loads(path.read_text())
        if key in current:
            current[key] = {**current[key], **fields}
            atomic_write(path, json.dumps(current, indent=2, sort_keys=True) + "\n")
