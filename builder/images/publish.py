"""Push images to the matrix's registry and record what was published.

Versioned tags go first; the moving ``latest-<vendor>`` alias moves only after every
versioned tag is in and its digest checked. After a push, the digest the registry reports
must equal the one the engine recorded; both go into ``dist/published.json``.
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
from builder.config.files import atomic_write
from builder.config.project import ResolvedTarget
from builder.oci import registry


def push_ref(client: docker.DockerClient, ref: str) -> str:
    """Push one tag; return the manifest digest the registry reports for it.

    Example:
        >>> push_ref(client, "localhost:5000/ml-runtime:cpu")
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
    if digest is None:
        raise TargetFailed(f"push of {ref}: the engine reported no digest")
    reported = registry.manifest_digest(ref, creds)
    if reported != digest:
        raise TargetFailed(f"push of {ref}: registry reports {reported}, the engine pushed {digest}")
    return digest


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


def push_target(
    client: docker.DockerClient, target: ResolvedTarget, image_id: str, extra: list[str | None] | None = None
) -> dict[str, Any]:
    """Push every tag of a built target (and *extra* refs, e.g. its content tag) first, aliases last.

    Returns its published record.
    """
    digests: dict[str, str] = {}
    for ref in [r for r in extra or [] if r] + push_order(target):
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
        "target": target.name,
        "image_id": image_id,
        "digest": digest,
        "reference": f"{repo}@{digest}",
        "tags": tags,
        "pushed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


#: Serialises record()'s read-change-write between this process's threads (``build -j``).
_RECORD_LOCK = threading.Lock()


def record(root: Path, records: list[dict[str, Any]]) -> Path:
    """Merge records into dist/published.json (one entry per target).

    Threads and processes (a lock file next to it) take turns, so no record is lost.
    """
    path = root / "dist" / "published.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    with _RECORD_LOCK, open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        current = json.loads(path.read_text()) if path.exists() else {}
        for rec in records:
            current[rec["target"]] = rec
        atomic_write(path, json.dumps(current, indent=2, sort_keys=True) + "\n")
    return path
