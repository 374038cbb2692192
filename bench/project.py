"""The bench's project as a user's script sees it: the ``builder`` CLI (``print``, ``base``, ``lock``,
``render``, ``build -q --json``, ``gc --dry-run --json``), the files it writes (base.lock.json, the
hash locks: devtools/locks.py) and docker. bench imports nothing of builder: it reads ``builder print``
through its JSON Schema, docs/print.schema.json (:func:`printed`), and keeps of it only what it uses.

Example:
    >>> load(Path(".")).target("nvidia-cu130").on("linux/arm64").lock
    'images/nvidia-cu130/requirements.arm64.lock'
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import docker
import jsonschema
import requests

from bench import baseline_context, baseline_wheels, run, say, timed
from devtools import locks
from devtools.support import (
    REPO,
    base_pin,
    copy_project,
    edit_matrix,
    engine_refs_under,
    host_platform,
    retarget_base_lock,
)

BASELINE_REPO = "ml-bench-baseline"
#: What ``builder print`` writes (builder/images/printed.py makes it; ``make schema`` writes this file).
PRINT_SCHEMA = REPO / "docs" / "print.schema.json"


@dataclass(frozen=True)
class Target:
    """A target of ``builder print``: what holds on each of its platforms."""

    name: str
    backend: str
    dockerfile: str
    platforms: list[str]
    locks: dict[str, str]
    refs: dict[str, list[str]]  # per platform: the tags its image gets in the local engine
    #: The platform of ``builder print``'s ``platform``: the host's when listed, else the first.
    default_platform: str

    def on(self, platform: str) -> TargetView:
        """This target on one of its platforms."""
        return TargetView(**{f.name: getattr(self, f.name) for f in dataclasses.fields(Target)}, platform=platform)

    def views(self) -> list[TargetView]:
        return [self.on(p) for p in self.platforms]

    @property
    def default_view(self) -> TargetView:
        return self.on(self.default_platform)


@dataclass(frozen=True)
class TargetView(Target):
    """A target of ``builder print`` on one of its platforms."""

    platform: str = dataclasses.field(kw_only=True)

    @property
    def lock(self) -> str:
        """This platform's hash lock (relative to the project's root)."""
        return self.locks[self.platform]

    @property
    def local_refs(self) -> list[str]:
        return self.refs[self.platform]

    @property
    def arch(self) -> str:
        return self.platform.split("/")[1]


@dataclass(frozen=True)
class Project:
    """What ``builder print`` says of a project copy: its root, base per platform and targets."""

    root: Path
    base: dict[str, str]
    targets: dict[str, Target]

    def target(self, name: str) -> Target:
        return self.targets[name]

    def base_for(self, platform: str) -> str:
        return self.base[platform]


def builder(root: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    """A whole ``builder ARGS`` process in *root* (this venv's), run to completion (raises on failure)."""
    exe = Path(sys.executable).parent / "builder"
    argv = [str(exe)] if exe.is_file() else [sys.executable, "-m", "builder"]
    return run([*argv, *args], cwd=root, env=env)


def printed(text: str) -> dict[str, Any]:
    """``builder print``'s output, checked against :data:`PRINT_SCHEMA` (SystemExit naming the first
    key that differs: the builder and this checkout's schema disagree).

    Example:
        >>> printed('{"root": "."}')
        Traceback (most recent call last):
        ...
        SystemExit: bench: builder print does not match docs/print.schema.json at (top): 'registry' is a required property; run the builder of this checkout, or make schema if the model changed
    """
    data = json.loads(text)
    validator = jsonschema.Draft202012Validator(json.loads(PRINT_SCHEMA.read_text()))
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        where = "/".join(str(k) for k in error.absolute_path) or "(top)"
        raise SystemExit(f"bench: builder print does not match docs/print.schema.json at {where}: {error.message}; "
                         "run the builder of this checkout, or make schema if the model changed")
    return data


def load(root: Path) -> Project:
    """The project at *root*, from ``builder print``."""
    data = printed(builder(root, "print").stdout)
    targets = {t["name"]: Target(t["name"], t["backend"], t["dockerfile"], t["platforms"], t["locks"],
                                 {p: plan["local_refs"] for p, plan in t["plan"].items()}, t["platform"])
               for t in data["targets"]}
    return Project(root, data["base"], targets)


def builder_build(root: Path, target: str, *flags: str, smoke: bool = False,
                  env: dict[str, str] | None = None) -> tuple[float, dict[str, Any]]:
    """Wall seconds of a whole ``builder build -t T [--no-smoke] -q --json [flags]`` process, and its JSON outcome."""
    args = ["build", "-t", target, *([] if smoke else ["--no-smoke"]), "-q", "--json", *flags]
    seconds, proc = timed(lambda: builder(root, *args, env=env))
    return seconds, json.loads(proc.stdout)[0]


def stores(root: Path, env: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """``builder gc --dry-run --json``'s stores by name: what each holds (``held``, bytes) and where."""
    return {s["store"]: s for s in json.loads(builder(root, "gc", "--dry-run", "--json", env=env).stdout)["stores"]}


@functools.cache
def wheelhouse(root: Path) -> Path:
    """The wheelhouse the builder uses in *root* (``builder gc``'s store of that name; asked once)."""
    return Path(stores(root)["wheelhouse"]["where"])


def locked_wheels(project: Project, view: TargetView) -> list[locks.Pin]:
    """The wheels that end up in the image: common.lock and the view's lock (uv's tools.lock does not)."""
    return (locks.read(locks.shared_lock(project.root, "common", view.platform))
            + locks.read(project.root / view.lock))


def tools_wheels(project: Project, platform: str) -> list[locks.Pin]:
    """The build-time installer's wheels (tools.lock)."""
    return locks.read(locks.shared_lock(project.root, "tools", platform))


def lock_and_render(project_root: Path, views: list[TargetView]) -> Project:
    """``builder lock`` the target views (per platform) and ``builder render`` them; the project as it is then."""
    say(f"locking {', '.join(v.name for v in views)}")
    try:
        for platform in dict.fromkeys(v.platform for v in views):
            names = [a for v in views if v.platform == platform for a in ("-t", v.name)]
            for line in builder(project_root, "lock", *names, "--platform", platform).stdout.splitlines():
                say(line)
        builder(project_root, "render", *(a for v in views for a in ("-t", v.name)))
    except RuntimeError as exc:
        raise SystemExit(f"bench: locking failed: {exc}") from None
    return load(project_root)


def baseline_for(project: Project, view: TargetView, folder: Path) -> Path:
    """The baseline's build context for *view* (:func:`bench.baseline_context`), from its locks."""
    house = wheelhouse(project.root)
    pins, uv = locked_wheels(project, view), tools_wheels(project, view.platform)
    return baseline_context(folder, project.root, view.backend, [house / p.filename for p in pins],
                            [p.requirement() for p in pins], [house / p.filename for p in uv],
                            [p.requirement() for p in uv])


class Made:
    """Every image the bench tags or builds, removed at the end.

    ``refs`` are the bench's own tags: removing the last tag of an image deletes it with its
    untagged parents. ``borrowed`` are extra tags on images that existed before (the base):
    only those tags go. ``ids`` are the images that lost their tags along the way. ``registries``
    are the bench's own registries: every name under them goes too (tags, and names by digest,
    as a base pinned there on another platform gets from a build).
    """

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client
        self.refs: list[str] = []
        self.borrowed: list[str] = []
        self.ids: list[str] = []
        self.registries: list[str] = []

    def _remove(self, ref: str) -> bool:
        try:
            self.client.api.remove_image(ref)
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError:
            return False  # a child still uses it: retried after the others
        return True

    def drop(self, ref: str) -> None:
        """Remove *ref* now (a measured image nothing later reads), so its layers do not hold the disk
        through the rest of the run; left to :meth:`close` if the engine refuses."""
        if not self._remove(ref):
            self.refs.append(ref)

    def close(self) -> None:
        """Remove what the bench made; an engine that stopped answering is said in one line, so the
        figures measured so far are still written."""
        try:
            self._close()
        except (docker.errors.DockerException, requests.exceptions.ConnectionError) as exc:
            say(f"could not remove the bench's images: the engine did not answer ({exc})")

    def _close(self) -> None:
        for ref in self.borrowed:
            try:
                tags = self.client.api.inspect_image(ref).get("RepoTags") or []
            except docker.errors.ImageNotFound:
                continue
            if set(tags) - set(self.borrowed):
                self._remove(ref)  # other tags keep the image: this only untags
        left = list(dict.fromkeys([*self.refs, *(n for r in self.registries for n in engine_refs_under(r)),
                                   *self.ids]))
        for _ in range(4):  # leaves first; a parent shared by two leaves goes on a later pass
            left = [ref for ref in left if not self._remove(ref)]
        if left:
            say(f"could not remove {len(left)} images: {', '.join(left)}")


def setup_project(client: docker.DockerClient, root: Path, host: str, made: Made, repository: str = "ml-bench",
                  lock_from: Path = REPO, **changes: Any) -> Path:
    """Copy the project, point it at the private registry (and *changes* to matrix.yaml), and pin the
    base there with ``builder base --update``: *lock_from*'s base, moved to it when local (or in its
    registry), else bootstrapped. Returns the copy's root (lock and render it next)."""
    copy_project(root)
    shutil.copy(lock_from / "base.lock.json", root / "base.lock.json")
    new_registry = f"{host}/{repository}"
    edit_matrix(root, registry=new_registry, **changes)
    pinned = builder(root, "base", "--update", "--platform", host_platform())  # the lock named the old registry
    say(pinned.stdout.strip().splitlines()[-1])
    reference = base_pin(root)["reference"]
    # The other platforms' pins keep their digests, named in this registry (the emulated row moves its own).
    retarget_base_lock(root, root, new_registry, reference.split("@", 1)[1])
    # The bench's registry (a fresh loopback port, its own) goes at the end: so do the base's tags in
    # it, on whichever image they are (a base bootstrapped here tags its platform's image, not the
    # pinned index).
    tags = [t for image in client.api.images(name=f"{new_registry}/base") for t in image.get("RepoTags") or []
            if t.startswith(f"{new_registry}/base:")]
    made.refs += [*tags, reference]
    made.registries.append(new_registry)
    return root


def docker_cli_build(context: Path, base: str, backend: str, tag: str, *flags: str) -> tuple[float, str]:
    """Wall seconds of the baseline's ``docker buildx build`` (as a user runs it) and the image's reference (*tag*)."""
    seconds, ref, _ = docker_cli_build_phases(context, base, backend, tag, *flags)
    return seconds, ref


#: BuildKit's vertices by name, as the builder's ``--json`` ``phases`` groups its own build's
#: (builder/oci/buildkit.py's PHASES; bench imports nothing of builder, as a user's script would not).
PHASES = (
    ("steps", re.compile(r"^\[[^\]]* \d+/\d+\] (?!FROM )")),
    ("context", re.compile(r"^\[(internal\] load (build context|\.dockerignore|build definition)|context )")),
    ("base and cache", re.compile(r"^(\[internal\] load metadata|\[auth\]|\[[^\]]* \d+/\d+\] FROM |importing cache)")),
    ("export", re.compile(r"^(exporting|writing image|naming to|unpacking to|sending tarball)")),
)
#: Two parts of the export, from BuildKit's statuses (builder/oci/buildkit.py's EXPORT_PARTS).
EXPORT_PARTS = (
    ("export: layers", re.compile(r"^exporting layers")),
    ("export: unpack", re.compile(r"^unpacking to ")),
)


def _rawjson_events(text: str) -> Iterator[dict[str, Any]]:
    """The JSON objects of ``--progress=rawjson`` output (pretty-printed, one after another)."""
    decoder, i = json.JSONDecoder(), 0
    while (start := text.find("{", i)) != -1:
        try:
            event, i = decoder.raw_decode(text, start)
        except ValueError:
            i = start + 1
            continue
        yield event


def _span(spans: dict[str, list[str]], key: str, name: str, item: dict[str, Any]) -> None:
    """Keep *item*'s first start and last completion under *key*: [name, started, completed]."""
    span = spans.setdefault(key, [name, "", ""])
    span[1] = span[1] or item.get("started", "")
    span[2] = item.get("completed") or span[2]


def _at(stamp: str) -> float:
    head, _, frac = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(head).replace(tzinfo=UTC).timestamp() + float(f"0.{frac or 0}")


def rawjson_phases(text: str) -> dict[str, float]:
    """BuildKit's seconds per phase from ``--progress=rawjson`` output, and the export's parts."""
    spans: dict[str, list[str]] = {}  # vertices: [name, started, completed]
    parts: dict[str, list[str]] = {}  # the export's, from its statuses: [part, started, completed]
    for event in _rawjson_events(text):
        for v in event.get("vertexes") or []:
            _span(spans, v.get("digest") or v.get("name", ""), v.get("name", ""), v)
        for s in event.get("statuses") or []:
            if (part := next((p for p, pattern in EXPORT_PARTS if pattern.match(s.get("id", ""))), None)) is not None:
                _span(parts, f"{s.get('vertex', '')}/{s['id']}", part, s)
    named = [(next((p for p, pattern in PHASES if pattern.match(name)), "other"), started, completed)
             for name, started, completed in spans.values()]
    out: dict[str, float] = {}
    for phase, started, completed in named + [tuple(span) for span in parts.values()]:
        if started and completed:
            out[phase] = out.get(phase, 0.0) + max(0.0, _at(completed) - _at(started))
    return {k: round(v, 2) for k, v in out.items()}


def docker_cli_build_phases(context: Path, base: str, backend: str, tag: str,
                            *flags: str) -> tuple[float, str, dict[str, float]]:
    """:func:`docker_cli_build`, and where its time went (:func:`rawjson_phases`)."""
    argv = [shutil.which("docker") or "docker", "buildx", "build", "--progress=rawjson", "--provenance=false", *flags,
            "--build-context", f"wheels={baseline_wheels(context)}",
            "--build-arg", f"BASE={base}", "--build-arg", f"GPU_BACKEND={backend}", "-t", tag, str(context)]
    seconds, proc = timed(lambda: run(argv, cwd=context))
    return seconds, tag, rawjson_phases(proc.stderr)


def touch_runtime(root: Path) -> None:
    """A comment appended to the runtime's __init__.py: the smallest change to the in-image code."""
    with (root / "runtime" / "ml_runtime" / "__init__.py").open("a") as handle:
        handle.write(f"# bench {time.time_ns()}\n")
