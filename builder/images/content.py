"""Content tags: one digest of everything that determines a target's image.

The digest covers the rendered Dockerfile (which pins the base by digest), every file its
``COPY`` lines take from the build context (the locks, ``runtime/``, ``examples/``: exactly
what ``.dockerignore`` lets into the context, with their executable bits), the base reference
and the platform. Labels that change with every commit (revision, created) are applied at
build time and are not part of it, so an unchanged target keeps its tag across commits.

The tag ``<registry>:<target>-<12 hex>`` is applied and pushed only after the smoke test
passed, so its presence, locally or in the registry, is the proof that this exact content was
built and tested: ``builder build`` then only moves the other tags.

Example:
    >>> content_tags(project, [project.target("cpu")])["cpu"]  # doctest: +ELLIPSIS
    'localhost:5000/ml-runtime:cpu-...'
"""

from __future__ import annotations

import hashlib
import json
import platform
import shlex
from pathlib import Path

from docker.utils.build import exclude_paths

from builder.config.project import Project, ResolvedTarget

#: Hex digits of the digest in the tag (48 bits: collisions among one target's versions are not a concern).
TAG_HEX = 12
#: Machine names as platform.machine() prints them -> OCI architectures.
OCI_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def host_platform() -> str:
    """The OCI platform images are built for on this host.

    Example:
        >>> host_platform() in ("linux/amd64", "linux/arm64")
        True
    """
    machine = platform.machine()
    return f"linux/{OCI_ARCH.get(machine, machine)}"


def copy_sources(dockerfile: str) -> list[str]:
    """Context paths the Dockerfile's ``COPY`` lines read (``--from`` copies read no context).

    Example:
        >>> copy_sources("FROM x\\nCOPY images/tools.lock images/common.lock /opt/locks/\\nCOPY --from=a /b /c\\n")
        ['images/tools.lock', 'images/common.lock']
    """
    sources: list[str] = []
    for line in dockerfile.splitlines():
        words = shlex.split(line, comments=True) if line.startswith(("COPY ", "ADD ")) else []
        if not words or any(w.startswith("--from") for w in words):
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        sources += [a.rstrip("/") for a in args[:-1]]
    return sources


def context_paths(root: Path) -> set[str]:
    """Every path ``.dockerignore`` lets into the build context (docker-py's own matching)."""
    ignore = root / ".dockerignore"
    patterns = [ln.strip() for ln in ignore.read_text().splitlines() if ln.strip() and not ln.startswith("#")] \
        if ignore.exists() else []
    return set(exclude_paths(str(root), patterns))


def content_tags(
    project: Project,
    targets: list[ResolvedTarget],
    rendered: dict[Path, str] | None = None,
    platform_name: str | None = None,
) -> dict[str, str]:
    """{target name: ``<registry>:<target>-<12 hex>``} of this exact content.

    The digest covers each target's Dockerfile (*rendered* in memory, else the one in images/),
    the context files its COPY lines take (hash and executable bit), the base and the
    platform. The context is walked, and each file hashed, once for all targets.

    Example:
        >>> content_tags(project, [project.target("cpu")])  # doctest: +ELLIPSIS
        {'cpu': 'localhost:5000/ml-runtime:cpu-...'}
    """
    root = project.root
    if rendered is None:
        from builder.images import render

        rendered = render.render(project, targets)
    included = sorted(p for p in context_paths(root) if (root / p).is_file())
    hashes: dict[str, list[object]] = {}

    def entry(rel: str) -> list[object]:
        if rel not in hashes:
            path = root / rel
            hashes[rel] = [rel, hashlib.sha256(path.read_bytes()).hexdigest(), bool(path.stat().st_mode & 0o111)]
        return hashes[rel]

    tags = {}
    for target in targets:
        dockerfile = rendered[root / target.dockerfile]
        sources = copy_sources(dockerfile)
        document = {
            "dockerfile": dockerfile,
            "files": [entry(p) for p in included if any(p == s or p.startswith(s + "/") for s in sources)],
            "base": project.base_ref,
            "platform": platform_name or host_platform(),
        }
        digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()
        tags[target.name] = f"{target.primary_ref.rsplit(':', 1)[0]}:{target.name}-{digest[:TAG_HEX]}"
    return tags
