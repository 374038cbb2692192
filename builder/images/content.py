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
    >>> content_tag(project, project.target("cpu"))  # doctest: +ELLIPSIS
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


def context_files(root: Path, dockerfile: str) -> list[str]:
    """The files in the build context below the Dockerfile's COPY sources, sorted."""
    ignore = root / ".dockerignore"
    patterns = [ln.strip() for ln in ignore.read_text().splitlines() if ln.strip() and not ln.startswith("#")] \
        if ignore.exists() else []
    included = exclude_paths(str(root), patterns)
    sources = copy_sources(dockerfile)
    return sorted(
        p for p in included
        if (root / p).is_file() and any(p == s or p.startswith(s + "/") for s in sources)
    )


def content_digest(
    project: Project, target: ResolvedTarget, platform_name: str | None = None, dockerfile: str | None = None
) -> str:
    """sha256 of the target's rendered Dockerfile, copied files, base and platform.

    *dockerfile* is the rendered text when it is not (yet) written to images/.

    Example:
        >>> content_digest(project, project.target("cpu"))  # doctest: +ELLIPSIS
        'sha256:...'
    """
    root = project.root
    if dockerfile is None:
        dockerfile = (root / target.dockerfile).read_text()
    files = []
    for rel in context_files(root, dockerfile):
        path = root / rel
        files.append([rel, hashlib.sha256(path.read_bytes()).hexdigest(), bool(path.stat().st_mode & 0o111)])
    document = {
        "dockerfile": dockerfile,
        "files": files,
        "base": project.base_ref,
        "platform": platform_name or host_platform(),
    }
    return "sha256:" + hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def content_tag(
    project: Project, target: ResolvedTarget, platform_name: str | None = None, dockerfile: str | None = None
) -> str:
    """The reference ``<registry>:<target>-<12 hex>`` of this exact content."""
    digest = content_digest(project, target, platform_name, dockerfile)
    repo = target.primary_ref.rsplit(":", 1)[0]
    return f"{repo}:{target.name}-{digest.removeprefix('sha256:')[:TAG_HEX]}"


def content_tags(project: Project, targets: list[ResolvedTarget]) -> dict[str, str]:
    """{target name: content tag}, from Dockerfiles rendered in memory (no file is written)."""
    from builder.images import render

    rendered = render.render(project, targets)
    return {t.name: content_tag(project, t, dockerfile=rendered[project.root / t.dockerfile]) for t in targets}
