"""Benchmark helpers: our lock-driven multi-stage build against the one-Dockerfile ARG-switch baseline.

``python -m bench`` (``make bench``) drives them and writes bench/out/results.{json,md}. Everything
runs on a temporary copy of the project with its own registry and wheel-server port, so the real
tree, its tags and a concurrent ``builder build`` are never touched.

Example:
    >>> layers(client, "localhost:5000/ml-runtime:cpu")[0].created_by  # doctest: +SKIP
    'mmdebstrap bookworm (python3, python3-venv, ca-certificates)'
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker

from devtools.dockerd import DockerdUnavailable, extra_dockerd
from devtools.support import docker_config, docker_login, registry_login, start_registry, stop

BASELINE_DOCKERFILE = Path(__file__).resolve().parent / "baseline" / "Dockerfile"
#: Samples per figure (medians of them).
REPEATS = 3


def say(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def registry(folder: Path) -> Iterator[str]:
    """A private docker-registry on a free loopback port for the block, with a login in ``DOCKER_CONFIG``
    meanwhile; yields host:port, removes its data.

    Example:
        >>> with registry(Path("/tmp/bench/registry")) as host:  # doctest: +SKIP
        ...     host.startswith("127.0.0.1:")
        True
    """
    user, password, htpasswd = registry_login(folder)
    try:
        host, proc = start_registry(folder, htpasswd)
    except FileNotFoundError as exc:
        raise SystemExit(f"bench: {exc}") from None
    # Its login, as `docker login` writes it, in a Docker config of the bench's own: the builder takes a
    # loopback registry it did not start only when it refuses anonymous requests and takes a login it holds.
    config = docker_config(folder / "docker-config")
    docker_login(config, host, user, password)
    before = os.environ.get("DOCKER_CONFIG")
    os.environ["DOCKER_CONFIG"] = str(config)
    try:
        yield host
    finally:
        stop(proc)
        if before is None:
            os.environ.pop("DOCKER_CONFIG", None)
        else:
            os.environ["DOCKER_CONFIG"] = before
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def second_engine(folder: Path) -> Iterator[str]:
    """An empty second dockerd for the block (a fresh runner or node); yields its DOCKER_HOST (devtools/dockerd.py).

    It has the containerd image store: what a new install of the current engine has (Engine 29's default).
    """
    try:
        with extra_dockerd(folder, "be", store="containerd") as host:
            yield host
    except DockerdUnavailable as exc:
        raise SystemExit(f"bench: {exc}") from None


#: The Dockerfile instructions BuildKit runs as a step of their own (its ``[stage n/m]`` vertices).
VERTEX_INSTRUCTIONS = frozenset({"RUN", "COPY", "ADD", "WORKDIR"})


def steps_before_last_stage(dockerfile: str) -> int:
    """Steps before the Dockerfile's last stage, counted as BuildKit counts them: the instructions
    that make a vertex (RUN, COPY, ADD, WORKDIR); FROM, ENV, ARG, LABEL and USER make none.

    "Only the last stage rebuilt" is "exactly these steps from cache".

    Example:
        >>> steps_before_last_stage("ARG A\\nFROM a AS b\\nRUN x\\nENV c=1\\nWORKDIR /w\\nFROM b\\nCOPY c /c\\n")
        2
    """
    joined = re.sub(r"\\[ \t]*\n(?:[ \t]*(?:#[^\n]*)?\n)*", " ", dockerfile)
    words = [ln.split(None, 1)[0].upper() for ln in joined.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    first, last = words.index("FROM"), max(i for i, w in enumerate(words) if w == "FROM")
    return sum(w in VERTEX_INSTRUCTIONS for w in words[first:last])


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(wall seconds, result) of ``fn()``."""
    start = time.monotonic()
    result = fn()
    return round(time.monotonic() - start, 2), result


def median(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command to completion; raise with its last output lines when it fails."""
    proc = subprocess.run(argv, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"bench: {' '.join(argv[:6])} ... exited {proc.returncode}: "
                           f"{(proc.stderr or proc.stdout)[-1500:]}")
    return proc


def installed_bytes(wheel: Path) -> int:
    """Bytes a wheel occupies once installed: the sum of its members' uncompressed sizes."""
    with zipfile.ZipFile(wheel) as archive:
        return sum(info.file_size for info in archive.infolist())


#: The instructions BuildKit records in the history as they are written, with no layer.
BUILDKIT_METADATA = ("ENV", "ARG", "LABEL", "USER", "WORKDIR", "ENTRYPOINT", "CMD", "EXPOSE", "VOLUME",
                     "STOPSIGNAL", "HEALTHCHECK", "SHELL", "ONBUILD", "MAINTAINER")


@dataclass(frozen=True)
class Layer:
    """One layer of an image: its diff ID, uncompressed size and the step that made it."""

    diff_id: str
    size: int
    created_by: str


def _makes_layer(entry: dict[str, Any]) -> bool:
    """History entries with a layer: any with bytes, and RUN/COPY/ADD, whose layer may be empty.

    The history API has no ``empty_layer`` flag, so the step's text tells. BuildKit writes the
    instruction (``ENV A=1``; ``RUN ... # buildkit``, a layer even when it changes nothing); the
    classic builder marks metadata steps ``#(nop)``, its COPY/ADD included.

    Example:
        >>> [_makes_layer({"CreatedBy": c, "Size": n}) for c, n in (("ENV A=1", 0), ("WORKDIR /w", 8192),
        ...  ("RUN /bin/sh -c true # buildkit", 0), ("/bin/sh -c #(nop)  LABEL x=y", 0))]
        [False, True, True, False]
    """
    step = entry.get("CreatedBy", "")
    if entry["Size"] > 0:
        return True
    if "#(nop)" in step:
        return any(f"#(nop) {k} " in step for k in ("COPY", "ADD"))
    return bool(step) and step.split(" ", 1)[0] not in BUILDKIT_METADATA


def layers(client: docker.DockerClient, image: str) -> list[Layer]:
    """The image's layers, oldest first, with their sizes from ``docker history``.

    RootFS.Layers holds diff IDs without sizes; history holds sizes without diff IDs. They pair
    up in order once the metadata-only entries are dropped; a count mismatch raises.
    """
    diff_ids = client.api.inspect_image(image)["RootFS"]["Layers"]
    entries = [e for e in reversed(client.api.history(image)) if _makes_layer(e)]
    if len(entries) != len(diff_ids):
        raise RuntimeError(f"bench: {image}: {len(entries)} history entries with layers, {len(diff_ids)} diff IDs")
    return [Layer(d, e["Size"], e.get("CreatedBy", "")) for d, e in zip(diff_ids, entries, strict=True)]


def shared_fraction(images: list[list[Layer]]) -> float | None:
    """Bytes in layers that two or more images share, over the bytes of all distinct layers.

    Example:
        >>> shared_fraction([[Layer("a", 3, ""), Layer("b", 1, "")], [Layer("a", 3, ""), Layer("c", 1, "")]])
        0.6
    """
    if len(images) < 2:
        return None
    sizes = {layer.diff_id: layer.size for image in images for layer in image}
    count = {d: sum(d in {layer.diff_id for layer in image} for image in images) for d in sizes}
    total = sum(sizes.values())
    return round(sum(s for d, s in sizes.items() if count[d] >= 2) / total, 6) if total else None


def shared_bytes(images: list[list[Layer]]) -> int | None:
    """Bytes stored once but used by two or more images (what a second target costs nothing for)."""
    if len(images) < 2:
        return None
    sizes = {layer.diff_id: layer.size for image in images for layer in image}
    sets = [{layer.diff_id for layer in image} for image in images]
    return sum(size for d, size in sizes.items() if sum(d in s for s in sets) >= 2)


def below(image: list[Layer], marker: str) -> list[Layer]:
    """The layers under the first one whose step mentions *marker* (where target-specific input enters)."""
    for i, layer in enumerate(image):
        if marker in layer.created_by:
            return image[:i]
    raise RuntimeError(f"bench: no layer mentions {marker!r}; the Dockerfile changed, update the bench")


def shared_by_all(stacks: list[list[Layer]]) -> float | None:
    """Bytes in layers every image has, over the bytes of the union (1.0: identical stacks)."""
    if len(stacks) < 2:
        return None
    sizes = {layer.diff_id: layer.size for stack in stacks for layer in stack}
    common = set.intersection(*({layer.diff_id for layer in stack} for stack in stacks))
    total = sum(sizes.values())
    return round(sum(sizes[d] for d in common) / total, 6) if total else None


def baseline_context(folder: Path, project_root: Path, backend: str, wheel_files: list[Path],
                     requirements: list[str], uv_files: list[Path], uv_requirements: list[str]) -> Path:
    """The baseline's build context (its Dockerfile, runtime, examples) in *folder*/context, and beside
    it, in :func:`baseline_wheels`, the named context ``wheels``: exactly the target's locked wheels
    and uv's, and their hash-locked requirements (``name==version --hash=sha256:...`` lines)."""
    context, wheels_dir = folder / "context", folder / "wheels"
    context.mkdir(parents=True, exist_ok=True)
    wheels_dir.mkdir(parents=True, exist_ok=True)
    for wheel in [*wheel_files, *uv_files]:
        dest = wheels_dir / wheel.name
        try:
            os.link(wheel, dest)  # same file system: no copy of GBs of wheels
        except OSError:
            shutil.copy2(wheel, dest)
    (wheels_dir / f"requirements-{backend}.txt").write_text("".join(f"{r}\n" for r in requirements))
    (wheels_dir / "requirements-uv.txt").write_text("".join(f"{r}\n" for r in uv_requirements))
    shutil.copy2(BASELINE_DOCKERFILE, context / "Dockerfile")
    sync_runtime(project_root, context)
    shutil.copytree(project_root / "examples", context / "examples", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return context


def baseline_wheels(context: Path) -> Path:
    """The ``wheels`` named context beside a :func:`baseline_context`."""
    return context.parent / "wheels"


def sync_runtime(project_root: Path, folder: Path) -> None:
    """Give the baseline context the project's current runtime/ (same files our build copies)."""
    shutil.rmtree(folder / "runtime", ignore_errors=True)
    (folder / "runtime").mkdir(parents=True)
    shutil.copy2(project_root / "runtime" / "pyproject.toml", folder / "runtime" / "pyproject.toml")
    shutil.copytree(project_root / "runtime" / "ml_runtime", folder / "runtime" / "ml_runtime",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
