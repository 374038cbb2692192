"""Content tags: one digest of everything that determines a target's image.

The digest covers the rendered Dockerfile, every file its ``COPY`` lines take from the build
context (``runtime/``, ``examples/``: exactly what ``.dockerignore`` lets into the context,
with their executable bits), the build arguments (the platform's base pin and every locked
wheel, layer by layer: :mod:`builder.wheels.layers`) and the platform (each platform of a target has its own tag). Labels that change with every commit (revision, created) are applied at
build time and are not part of it, so an unchanged target keeps its tag across commits.

The tag ``<registry>:<target>-<12 hex>`` (:func:`builder.config.tags.content_tag`) is applied and pushed only after the smoke test
passed, so its presence, locally or in the registry, is the proof that this exact content was
built and tested: ``builder build`` then only moves the other tags.

Example:
    >>> content_tags(project, project.target("cpu").views())["cpu"]  # doctest: +ELLIPSIS
    'localhost:5000/ml-runtime:cpu-...'
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from builder.config import tags
from builder.config.project import Project, TargetView
from builder.gc import stores
from builder.images import render
from builder.oci.docker import exclude_paths
from builder.wheels import layers


def copy_sources(dockerfile: str, args: dict[str, str] | None = None) -> list[str]:
    """Context paths the Dockerfile reads: its ``COPY``/``ADD`` sources and the sources of its
    ``RUN --mount=type=bind`` mounts of the main context (a ``--from`` copy or mount reads no
    context), with the build *args* (``${TARGETARCH}``) put in as the build will.

    Example:
        >>> copy_sources("FROM x\\nCOPY images/tools.${TARGETARCH}.lock /opt/locks/\\nCOPY --from=a /b /c\\n"
        ...              "RUN --mount=type=bind,source=runtime,target=/r true\\n", {"TARGETARCH": "arm64"})
        ['images/tools.arm64.lock', 'runtime']
    """
    values = args or {}
    sources: list[str] = []
    for raw in re.sub(r"\\[ \t]*\n", " ", dockerfile).splitlines():
        line = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m[1] or m[2], m[0]), raw)
        if line.startswith(("COPY ", "ADD ")):
            words = shlex.split(line, comments=True)
            if not any(w.startswith("--from") for w in words):
                paths = [w for w in words[1:] if not w.startswith("--")]
                sources += [p.rstrip("/") for p in paths[:-1]]
        elif line.startswith("RUN "):
            for mount in re.findall(r"--mount=(\S+)", line):
                fields = dict(f.split("=", 1) if "=" in f else (f, "") for f in mount.split(","))
                if fields.get("type") == "bind" and "from" not in fields:
                    sources.append(str(fields.get("source") or fields.get("src") or ".").strip("/") or ".")
    return sources


def build_args(project: Project, view: TargetView) -> dict[str, str]:
    """The build arguments of a target view: its platform's base pin and each layer's wheels
    from the platform's locks (:mod:`builder.wheels.layers`).

    Example:
        >>> build_args(project, project.target("cpu").default_view)["WHEELS_TORCH"]  # doctest: +ELLIPSIS
        'torch==2.13.0+cpu --hash=sha256:...'
    """

    return {"BASE": project.base_for(view.platform), **layers.build_args(project, view)}


def context_paths(root: Path) -> set[str]:
    """Every path ``.dockerignore`` lets into the build context (docker-py's own matching)."""
    ignore = root / ".dockerignore"
    patterns = [ln.strip() for ln in ignore.read_text().splitlines() if ln.strip() and not ln.startswith("#")] \
        if ignore.exists() else []
    return set(exclude_paths(str(root), patterns))


def content_tags(
    project: Project,
    views: Sequence[TargetView],
    rendered: dict[Path, str] | None = None,
) -> dict[str, str]:
    """{view's unit: ``<registry>:<target>-<12 hex>``} of this exact content, per target view (platform).

    The digest covers each target's Dockerfile (*rendered* in memory, else the one in images/),
    the context files its COPY lines take (hash and executable bit), its build arguments (base pin,
    locked wheels) and the platform. The context is walked, and each file hashed, once for all.

    Example:
        >>> content_tags(project, project.target("cpu").views())  # doctest: +ELLIPSIS
        {'cpu': 'localhost:5000/ml-runtime:cpu-...'}
    """
    root = project.root
    if rendered is None:
        rendered = render.render(project, views)
    included = sorted(p for p in context_paths(root) if (root / p).is_file())
    hashes: dict[str, list[object]] = {}

    def entry(rel: str) -> list[object]:
        if rel not in hashes:
            path = root / rel
            hashes[rel] = [rel, hashlib.sha256(path.read_bytes()).hexdigest(), bool(path.stat().st_mode & 0o111)]
        return hashes[rel]

    found = {}
    for view in views:
        dockerfile = rendered[root / view.dockerfile]
        args = build_args(project, view)
        sources = copy_sources(dockerfile, args)
        document = {
            "dockerfile": dockerfile,
            "files": [entry(p) for p in included if any(p == s or p.startswith(s + "/") for s in sources)],
            "args": args,  # the base pin and every locked wheel, layer by layer
            "platform": view.platform,
            "compression": view.compression,  # other layer blobs, so another image
            # Under qemu the bytecode step compiles instead of importing (EMULATED): other layers.
            "emulated": not view.native,
        }
        digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()
        found[view.unit] = tags.content_tag(tags.repository_of(view.primary_ref), view.name, digest)
    return found


def current_refs(project: Project) -> set[str]:
    """Every tag this checkout's target views give an image now: content tags, local tags and their
    wheel contexts' images (:mod:`builder.wheels.images`): what ``builder gc`` never removes an image under."""
    views = [v for t in project.targets for v in t.views()]
    return set(content_tags(project, views).values()) | {ref for v in views for ref in v.local_refs} | \
        stores.current_context_images(project, views)
