"""Provenance of a pushed image: an in-toto Statement v1 with a SLSA provenance v1 predicate.

It names the image (subject: repository and manifest digest) and how it was made:
``externalParameters`` hold the target's resolved matrix entry for the platform (what
``builder print`` shows, every URL in its credential-free form) and its content tag;
``resolvedDependencies`` the source by its git remote (credential-free; never a local path) and
commit (with whether the tree was dirty), the base by digest, each lock the image installs and the
Dockerfile, each with its SHA-256; ``runDetails.builder`` the builder and its version.

Example:
    >>> st = statement(project, project.target("cpu").default_view, "localhost:5000/ml-runtime@sha256:ab...", None)
    >>> st["predicateType"], st["subject"][0]["digest"]
    ('https://slsa.dev/provenance/v1', {'sha256': 'ab...'})
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from builder.config.errors import UserError
from builder.config.project import Project, TargetView
from builder.config.urls import public
from builder.oci.registry import Ref
from builder.oci.secrets import GIT, child_env
from builder.supply.sbom import builder_version, contents

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
#: What the build type URI names: a build of one target view of matrix.yaml by ``builder build``.
BUILD_TYPE = "https://github.com/example/ml-image-builder/buildtypes/target/v1"
BUILDER_ID = "https://github.com/example/ml-image-builder"


def subject(image: str) -> list[dict[str, Any]]:
    """The in-toto subject of a pushed image ``host/repo@sha256:<hex>``.

    Example:
        >>> subject("localhost:5000/ml-runtime@sha256:ab")
        [{'name': 'localhost:5000/ml-runtime', 'digest': {'sha256': 'ab'}}]
    """
    r = Ref.parse(image)
    if not r.digest or not r.digest.startswith("sha256:"):
        raise UserError(f"{image} names no sha256 digest (host/repo@sha256:<hex>)")
    return [{"name": r.name, "digest": {"sha256": r.digest.removeprefix("sha256:")}}]


def git_state(root: Path) -> tuple[str, bool]:
    """(HEAD's commit, whether tracked files differ from it) of the checkout at *root*; ("unknown", False) outside git."""

    def git(*args: str) -> tuple[int, str]:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False,
                              env=child_env(GIT))
        return proc.returncode, proc.stdout.strip()

    code, revision = git("rev-parse", "HEAD")
    if code != 0 or not revision:
        return "unknown", False
    return revision, bool(git("status", "--porcelain", "--untracked-files=no")[1])


def git_remote(root: Path) -> str | None:
    """The checkout's remote as a credential-free ``git+`` URI (the branch's upstream remote, else
    ``origin``, else the only one); None without one. A local path is never named.

    Example:
        >>> remote_uri("https://ci:ghp_x@github.com/org/ml-image-builder.git")
        'git+https://github.com/org/ml-image-builder.git'
        >>> remote_uri("git@github.com:org/ml-image-builder.git")
        'git+ssh://github.com/org/ml-image-builder.git'
    """

    def git(*args: str) -> str:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False,
                              env=child_env(GIT))
        return proc.stdout.strip() if proc.returncode == 0 else ""

    names = git("remote").split()
    upstream = git("rev-parse", "--abbrev-ref", "--symbolic-full-name", "@{upstream}").partition("/")[0]
    name = next((n for n in (upstream, "origin") if n in names), names[0] if len(names) == 1 else None)
    return remote_uri(git("remote", "get-url", name)) if name else None


def remote_uri(url: str) -> str | None:
    """A git remote URL as a credential-free ``git+<scheme>://`` URI; None for a local path."""
    scp = re.fullmatch(r"(?:[^@/:]+@)?([^/:]+):(?!//)(.+)", url)
    if scp and "://" not in url:
        return f"git+ssh://{scp.group(1)}/{scp.group(2).lstrip('/')}"
    if "://" not in url or url.startswith("file:"):
        return None
    return "git+" + public(url.removeprefix("git+"))


def _file(root: Path, rel: str) -> dict[str, Any]:
    path = root / rel
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise UserError(f"{rel}: cannot read it for the provenance ({exc.strerror}); run 'builder render'") from None
    return {"name": rel, "uri": f"file:{rel}", "digest": {"sha256": digest}}


def statement(project: Project, view: TargetView, image: str, content_tag: str | None,
              started: str | None = None, built_at: str | None = None) -> dict[str, Any]:
    """The provenance statement of *view*'s image *image* (``host/repo@sha256:<hex>``).

    *built_at* is the commit the image's own ``org.opencontainers.image.revision`` label names
    (``<commit>`` or ``<commit>-dirty``): an image reused under its content tag was built at an
    earlier commit of the same content, and the provenance names that one, the commit a rebuild
    (``builder verify --rebuild``) must check out. Without it: the checkout's HEAD.

    Example:
        >>> image, tag = "localhost:5000/ml-runtime@sha256:ab...", "localhost:5000/ml-runtime:cpu-0123"
        >>> statement(project, cpu, image, tag)["predicate"]["buildDefinition"]["externalParameters"]["target"]
        'cpu'
    """
    c = contents(project, view)
    if built_at:
        revision, dirty = built_at.removesuffix("-dirty"), built_at.endswith("-dirty")
    else:
        revision, dirty = git_state(project.root)
    # The index as given may hold its login (https://user:token@mirror/simple): published without it.
    entry = {**asdict(view), "index_url": public(view.index_url), "lock": view.lock, "arch": view.arch}
    base = Ref.parse(c.base)
    remote = git_remote(project.root)
    dependencies: list[dict[str, Any]] = [
        {"name": "source", **({"uri": remote} if remote else {}), "digest": {"gitCommit": revision},
         "annotations": {"dirty": dirty}},
    ]
    if base.digest:
        dependencies.append({"name": "base", "uri": f"oci://{base.name}@{base.digest}",
                             "digest": {"sha256": base.digest.removeprefix("sha256:")}})
    dependencies += [_file(project.root, rel) for rel, _ in c.locks]
    dependencies.append(_file(project.root, view.dockerfile))
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "_type": STATEMENT_TYPE,
        "subject": subject(image),
        "predicateType": SLSA_PROVENANCE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"target": view.name, "platform": view.platform,
                                       "matrix_entry": entry, "content_tag": content_tag},
                "internalParameters": {"builder_version": builder_version(), "registry": project.matrix.registry,
                                       "python": project.matrix.python, "installer": project.matrix.installer},
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID, "version": {"ml-image-builder": builder_version()}},
                "metadata": {"invocationId": f"{view.unit}@{revision}{'-dirty' if dirty else ''}",
                             "startedOn": started or now, "finishedOn": now},
                "byproducts": [{"name": "content-tag", "uri": f"oci://{content_tag}"}] if content_tag else [],
            },
        },
    }
