"""``python -m bench``: cold, no-op and runtime-change builds, image size and layer sharing, ours vs. baseline.

Writes bench/out/results.json and bench/out/results.md. Runs on a temporary copy of the project
(own registry on a free loopback port, own wheel-server port) and removes every image it made.

Build avoidance (content tags), measured as users run it, smoke test on: a no-op ``builder build``
(reused-local), a fresh runner deciding to skip (an empty second dockerd, the image in the
registry: reused-registry), a runtime/ change (rebuild + smoke) and ``make images`` with nothing
changed. ``--only avoidance`` runs just those rows (one cold build per target first).

Bounded state (``--only disk``): on an empty second dockerd, with a wheelhouse of its own and a local
index on loopback, the disk the builder's stores hold after 10 cycles of "the index gains a release of a
shared dependency, cpu gets one more package that needs it, build" against after the first build, then
after ``builder gc``.

Example:
    $ python -m bench --quick                          # cpu only, for trying it out
    $ python -m bench --targets cpu,nvidia-cu130       # the full run (several GB, ~20 min)
    $ python -m bench --only avoidance --targets cpu   # only the build-avoidance rows (~6 min)
    $ python -m bench --only disk                      # the stores' disk over 10 cycles, then gc (~15 min)
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import requests
import yaml

from bench import (
    Layer,
    baseline_context,
    baseline_wheels,
    below,
    installed_bytes,
    layers,
    median,
    registry,
    run,
    second_engine,
    shared_by_all,
    shared_bytes,
    shared_fraction,
    steps_before_last_stage,
    sync_runtime,
    timed,
)
from builder.config.platforms import host_platform
from builder.config.project import Project, ResolvedTarget, load_project
from builder.images import lockfile, locks, render, wheelhouse
from builder.images.base import base_tag, ensure_base
from builder.images.publish import push_ref
from builder.oci.engine import connect
from devtools.support import (
    REPO,
    base_pin,
    copy_project,
    edit_matrix,
    registry_layers,
    retarget_base_lock,
)

REPEATS = 3
#: The cold build's goal per target, ours over the strong baseline (issue 32); other targets take cpu's.
COLD_GOAL = {"cpu": 0.45, "nvidia-cu130": 0.3}
#: Where target-specific input first enters each stack: the first layer of the plan (ours), the
#: install of uv and the backend's wheels (baseline).
MARKERS = {"ours": 'if [ -n "$WHEELS_', "baseline": "requirements-uv.txt"}
BASELINE_REPO = "ml-bench-baseline"
#: The rows ``--only`` can pick, in the order they run.
ROWS = ("baseline", "avoidance", "emulated", "start", "fresh-node", "disk")


def say(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


class Made:
    """Every image the bench tags or builds, removed at the end.

    ``refs`` are the bench's own tags: removing the last tag of an image deletes it with its
    untagged parents. ``borrowed`` are extra tags on images that existed before (the base):
    only those tags go. ``ids`` are the images that lost their tags along the way.
    """

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client
        self.refs: list[str] = []
        self.borrowed: list[str] = []
        self.ids: list[str] = []

    def _remove(self, ref: str) -> bool:
        try:
            self.client.api.remove_image(ref)
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError:
            return False  # a child still uses it: retried after the others
        return True

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
        left = list(dict.fromkeys([*self.refs, *self.ids]))
        for _ in range(4):  # leaves first; a parent shared by two leaves goes on a later pass
            left = [ref for ref in left if not self._remove(ref)]
        if left:
            say(f"could not remove {len(left)} images: {', '.join(left)}")


def setup_project(client: docker.DockerClient, root: Path, host: str, made: Made, repository: str = "ml-bench",
                  lock_from: Path = REPO, **changes: Any) -> Project:
    """Copy the project, point it at the private registry (and *changes* to matrix.yaml), and pin the
    base there: *lock_from*'s base, moved to it when local (or in its registry), else bootstrapped."""
    copy_project(root)
    shutil.copy(lock_from / "base.lock.json", root / "base.lock.json")
    new_registry = f"{host}/{repository}"
    edit_matrix(root, registry=new_registry, **changes)
    unpinned = load_project(root / "matrix.yaml", allow_unpinned=True)  # the lock names the old registry
    pinned = ensure_base(client, unpinned, host_platform(), update=True, say=say)
    # The other platforms' pins keep their digests, named in this registry (the emulated row moves its own).
    retarget_base_lock(root, root, new_registry, pinned.reference.split("@", 1)[1])
    project = load_project(root / "matrix.yaml")
    made.refs += [base_tag(project, host_platform()), pinned.reference]  # the bench registry goes: so do they
    return project


def locked_wheels(project: Project, target: ResolvedTarget) -> list[lockfile.Pin]:
    """The wheels that end up in the image: common.lock and the target's lock (uv's tools.lock does not)."""
    _, common = lockfile.read_lock(locks.shared_lock_path(project, "common", target.platform))
    _, own = lockfile.read_lock(project.root / target.lock)
    return common + own


def builder_build(root: Path, target: str, *flags: str, smoke: bool = False,
                  env: dict[str, str] | None = None) -> tuple[float, dict[str, Any]]:
    """Wall seconds of a whole ``builder build -t T [--no-smoke] -q --json [flags]`` process, and its JSON outcome."""
    exe = Path(sys.executable).parent / "builder"
    argv = [str(exe)] if exe.is_file() else [sys.executable, "-m", "builder"]
    argv += ["build", "-t", target, *([] if smoke else ["--no-smoke"]), "-q", "--json", *flags]
    seconds, proc = timed(lambda: run(argv, cwd=root, env=env))
    return seconds, json.loads(proc.stdout)[0]


def docker_cli_build(context: Path, base: str, backend: str, tag: str, *flags: str) -> tuple[float, str]:
    """Wall seconds of the baseline's ``docker buildx build`` (as a user runs it) and the image's reference (*tag*)."""
    seconds, ref, _ = docker_cli_build_phases(context, base, backend, tag, *flags)
    return seconds, ref


def docker_cli_build_phases(context: Path, base: str, backend: str, tag: str,
                            *flags: str) -> tuple[float, str, dict[str, float]]:
    """:func:`docker_cli_build`, and where its time went: BuildKit's seconds per phase, read from its
    ``--progress=rawjson`` events as the builder reads its own (``phases`` of its ``--json``)."""
    from builder.oci.buildkit import Phases, _events

    argv = [shutil.which("docker") or "docker", "buildx", "build", "--progress=rawjson", "--provenance=false", *flags,
            "--build-context", f"wheels={baseline_wheels(context)}",
            "--build-arg", f"BASE={base}", "--build-arg", f"GPU_BACKEND={backend}", "-t", tag, str(context)]
    seconds, proc = timed(lambda: run(argv, cwd=context))
    phases = Phases()
    for event in _events(io.StringIO(proc.stderr)):
        for vertex in event.get("vertexes") or []:
            phases.update(vertex)
    return seconds, tag, phases.seconds()


def touch_runtime(root: Path) -> None:
    """A comment appended to the runtime's __init__.py: the smallest change to the in-image code."""
    with (root / "runtime" / "ml_runtime" / "__init__.py").open("a") as handle:
        handle.write(f"# bench {time.time_ns()}\n")


def lock_and_render(project: Project, targets: list[ResolvedTarget]) -> None:
    say(f"locking {', '.join(t.name for t in targets)} (wheels into {wheelhouse.location()})")
    failed = locks.lock_all(project, targets, say)
    if failed:
        raise SystemExit(f"bench: locking failed: {failed}")
    render.write(render.render(project, targets))


def measure(client: docker.DockerClient, project: Project, targets: list[ResolvedTarget], tmp: Path,
            made: Made) -> dict[str, Any]:
    root = project.root
    house = wheelhouse.location()
    pins = {t.name: locked_wheels(project, t) for t in targets}
    uv = locks.tools_lock(project, host_platform())
    contexts = {t.name: baseline_context(tmp / f"baseline-{t.name}", root, t.backend,
                                         [house / p.filename for p in pins[t.name]],
                                         [f"{p.name}=={p.version} --hash=sha256:{p.sha256}" for p in pins[t.name]],
                                         [house / p.filename for p in uv],
                                         [f"{p.name}=={p.version} --hash=sha256:{p.sha256}" for p in uv])
                for t in targets}
    base = project.base_for(host_platform())
    ours: dict[str, Any] = {k: {} for k in ("cold_build_s", "noop_rebuild_s_per_target", "noop_samples_s",
                                            "runtime_change_rebuild_s", "runtime_change_samples_s",
                                            "image_bytes", "essential_bytes", "size_ratio_vs_essential")}
    theirs: dict[str, Any] = {k: {} for k in ours}
    ours["noop_all_cached"] = {}
    stacks: dict[str, dict[str, list[Layer]]] = {"ours": {}, "baseline": {}}

    # Cold: whole processes as users run them, no layer cache, REPEATS rounds interleaved (ours, baseline,
    # baseline, ours, ...) so both see the same load: ours `builder build -t T --rebuild --no-smoke -q --json`
    # (zstd, the default), the baseline `docker buildx build --no-cache` of its Dockerfile (gzip, Docker's).
    ours["cold_samples_s"], theirs["cold_samples_s"] = {}, {}
    for t in targets:
        mine: list[float] = []
        their: list[float] = []
        mine_phases: list[dict[str, float]] = []
        their_phases: list[dict[str, float]] = []
        for i in range(REPEATS):
            for who in (("ours", "baseline") if i % 2 == 0 else ("baseline", "ours")):
                if who == "ours":
                    seconds, outcome = builder_build(root, t.name, "--rebuild", "--platform", t.platform)
                    if outcome.get("error"):
                        raise SystemExit(f"bench: cold build of {t.name}: {outcome['error']}")
                    mine.append(seconds)
                    made.ids.append(outcome["image_id"])
                    mine_phases.append(outcome.get("phases") or {})
                else:
                    tag = f"{BASELINE_REPO}:{t.name}-cold-{os.getpid()}"
                    made.refs.append(tag)
                    seconds, _, where = docker_cli_build_phases(contexts[t.name], base, t.backend, tag, "--no-cache")
                    their.append(seconds)
                    their_phases.append(where)
        ours["cold_samples_s"][t.name], theirs["cold_samples_s"][t.name] = mine, their
        # where the time went (BuildKit's seconds per phase), per phase the median of the samples
        for record, phase_samples in ((ours, mine_phases), (theirs, their_phases)):
            record.setdefault("cold_phases_s", {})[t.name] = {
                k: median([p.get(k, 0.0) for p in phase_samples]) for k in sorted({k for p in phase_samples for k in p})}
        ours["cold_build_s"][t.name], theirs["cold_build_s"][t.name] = median(mine), median(their)
        say(f"{t.name}: cold build {mine} s, baseline {their} s")

    # Settle: one ordinary build each, as users run them (cached, tagged). Sizes and sharing are
    # measured on these: nocache rebuilt the shared stage per target, so its images share nothing.
    final: dict[str, dict[str, str]] = {"ours": {}, "baseline": {}}
    tags = {t.name: f"{BASELINE_REPO}:{t.name}-{os.getpid()}" for t in targets}
    for t in targets:
        made.refs.append(tags[t.name])
        final["ours"][t.name] = builder_build(root, t.name)[1]["image_id"]
        final["baseline"][t.name] = docker_cli_build(contexts[t.name], base, t.backend, tags[t.name])[1]
        made.ids += [final["ours"][t.name], final["baseline"][t.name]]
        essential = client.api.inspect_image(base)["Size"] + sum(
            installed_bytes(house / p.filename) for p in pins[t.name])
        for side, name in ((ours, "ours"), (theirs, "baseline")):
            stacks[name][t.name] = layers(client, final[name][t.name])
            side["image_bytes"][t.name] = client.api.inspect_image(final[name][t.name])["Size"]
            side["essential_bytes"][t.name] = essential
            side["size_ratio_vs_essential"][t.name] = round(side["image_bytes"][t.name] / essential, 4)

    # No-op: the whole CLI process for ours; `docker build` of the same Dockerfile for the baseline.
    for t in targets:
        samples, theirs_samples, cached = [], [], []
        for _ in range(REPEATS):
            seconds, outcome = builder_build(root, t.name)
            samples.append(seconds)
            cached.append(outcome["cached_steps"] == outcome["steps"])
            made.ids.append(outcome["image_id"])
            seconds, image_id = docker_cli_build(contexts[t.name], base, t.backend, tags[t.name])
            theirs_samples.append(seconds)
            made.ids.append(image_id)
        say(f"{t.name}: no-op {samples} s, baseline {theirs_samples} s")
        ours["noop_samples_s"][t.name], theirs["noop_samples_s"][t.name] = samples, theirs_samples
        ours["noop_rebuild_s_per_target"][t.name] = median(samples)
        theirs["noop_rebuild_s_per_target"][t.name] = median(theirs_samples)
        ours["noop_all_cached"][t.name] = all(cached)

    # Runtime change: a comment in the in-image runtime, then rebuild (ours: the CLI; baseline: docker build).
    for t in targets:
        samples, theirs_samples = [], []
        for _ in range(REPEATS):
            touch_runtime(root)
            seconds, outcome = builder_build(root, t.name)
            samples.append(seconds)
            made.ids.append(outcome["image_id"])
            sync_runtime(root, contexts[t.name])
            seconds, image_id = docker_cli_build(contexts[t.name], base, t.backend, tags[t.name])
            theirs_samples.append(seconds)
            made.ids.append(image_id)
        say(f"{t.name}: runtime change {samples} s, baseline {theirs_samples} s")
        ours["runtime_change_samples_s"][t.name], theirs["runtime_change_samples_s"][t.name] = samples, theirs_samples
        ours["runtime_change_rebuild_s"][t.name] = median(samples)
        theirs["runtime_change_rebuild_s"][t.name] = median(theirs_samples)

    for side, name in ((ours, "ours"), (theirs, "baseline")):
        images = [stacks[name][t.name] for t in targets]
        side["shared_bytes_fraction"] = shared_fraction(images)
        side["shared_bytes"] = shared_bytes(images)
        side["shared_fraction_below_torch"] = shared_by_all([below(s, MARKERS[name]) for s in images])
    return {**ours, "baseline": theirs}


def repeat(fn: Callable[[], tuple[float, dict[str, Any]]], made: Made) -> tuple[list[float], list[dict[str, Any]]]:
    """REPEATS runs of a timed ``builder build``: (seconds, outcomes); every image and content tag goes to *made*."""
    samples, outcomes = [], []
    for _ in range(REPEATS):
        seconds, outcome = fn()
        samples.append(seconds)
        outcomes.append(outcome)
        made.refs += [outcome["content_tag"]] if outcome.get("content_tag") else []
        made.ids += [outcome["image_id"]] if outcome.get("image_id") else []
    return samples, outcomes


def make_images(root: Path, targets: list[ResolvedTarget]) -> float:
    """Wall seconds of ``make images TARGETS="..."`` in the project copy, with this checkout's Makefile and venv.

    The copy gets the Makefile and pyproject.toml (mtimes kept), so ``install`` finds the venv current;
    if it is not (pyproject.toml newer than .venv/.installed) this raises rather than reinstall it.
    """
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy2(REPO / name, root / name)
    venv = Path(sys.executable).parent.parent
    make = [shutil.which("make") or "make", f"VENV={venv}", f"TARGETS={' '.join(t.name for t in targets)}"]
    if subprocess.run([*make, "-q", f"{venv}/.installed"], cwd=root, capture_output=True, check=False).returncode:
        raise SystemExit(f"bench: {venv} is not current for pyproject.toml: run `make install` first")
    return timed(lambda: run([*make, "images"], cwd=root))[0]


def avoidance(project: Project, targets: list[ResolvedTarget], tmp: Path, made: Made) -> dict[str, Any]:
    """Build avoidance as users run it (smoke on, whole processes, median of REPEATS); see the module docstring."""
    root = project.root
    out: dict[str, Any] = {k: {} for k in ("noop_s", "noop_samples_s", "noop_results", "fresh_runner_s",
                                           "fresh_runner_samples_s", "fresh_runner_results", "runtime_change_s",
                                           "runtime_change_samples_s", "runtime_change_steps", "runtime_change_ok")}
    for t in targets:  # once: a smoke-tested build carries the content tag; then it goes to the registry
        say(f"{t.name}: build with smoke test, push")
        for flags in ((), ("--push",)):
            outcome = builder_build(root, t.name, *flags, smoke=True)[1]
            made.refs.append(outcome["content_tag"])
            made.ids += [outcome["image_id"]] if outcome.get("image_id") else []

    def record(key: str, t: ResolvedTarget, samples: list[float], outcomes: list[dict[str, Any]]) -> None:
        out[key + "_samples_s"][t.name], out[key + "_s"][t.name] = samples, median(samples)
        if key + "_results" in out:
            out[key + "_results"][t.name] = [o["result"] for o in outcomes]
        say(f"{t.name}: {key.replace('_', ' ')} {samples} s, {[o['result'] for o in outcomes]}")

    for t in targets:
        record("noop", t, *repeat(functools.partial(builder_build, root, t.name, smoke=True), made))
    samples = [make_images(root, targets) for _ in range(REPEATS)]
    out["make_images_noop_samples_s"], out["make_images_noop_s"] = samples, median(samples)
    out["make_images_targets"] = [t.name for t in targets]
    say(f"make images TARGETS={' '.join(t.name for t in targets)}: {samples} s")
    with second_engine(tmp / "engine2") as host:
        for t in targets:
            record("fresh_runner", t, *repeat(functools.partial(builder_build, root, t.name, smoke=True,
                                                                env={"DOCKER_HOST": host}), made))
    for t in targets:
        before = steps_before_last_stage((root / t.dockerfile).read_text())

        def change(name: str = t.name) -> tuple[float, dict[str, Any]]:
            touch_runtime(root)
            return builder_build(root, name, smoke=True)

        samples, outcomes = repeat(change, made)
        record("runtime_change", t, samples, outcomes)
        out["runtime_change_steps"][t.name] = [f"{o['cached_steps']}/{o['steps']}" for o in outcomes]
        out["runtime_change_ok"][t.name] = all(  # one process, one build, one smoke test: "passed" is once
            o["result"] == "built" and o["smoke"] == "passed" and o["cached_steps"] == before for o in outcomes)
        out.setdefault("steps_before_last_stage", {})[t.name] = before
    return out


def pushed_layers(ref: str, before: set[str]) -> tuple[int, int, list[int]]:
    """(bytes of the manifest's layers that were not in the registry *before*, bytes of all its layers,
    positions of the new ones), read from the registry."""
    layers_ = registry_layers(ref)
    new = [i for i, (digest, _) in enumerate(layers_) if digest not in before]
    return sum(layers_[i][1] for i in new), sum(size for _, size in layers_), new


def first_epoch(argv: list[str]) -> float:
    """Seconds from starting *argv* (a ``docker run`` of the example training) to its first epoch's
    line: a new container's start, imports, data, one epoch. The command must then succeed."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    seconds = None
    for line in proc.stdout:
        if seconds is None and line.lstrip().startswith("epoch"):
            seconds = round(time.monotonic() - start, 2)
    if proc.wait() != 0 or seconds is None:
        raise RuntimeError(f"bench: {' '.join(argv)} exited {proc.returncode} (first epoch seen: {seconds is not None})")
    return seconds


def fresh_node(client: docker.DockerClient, project: Project, host: str, tmp: Path, made: Made) -> dict[str, Any]:
    """nvidia-cu130 on a fresh node: the layer plan with zstd layers against the same plan with gzip, same run.

    Both are built as users build them (smoke on) and pushed to the bench registry; then, REPEATS
    times and alternating which goes first, an empty second dockerd pulls each (whole ``docker
    pull``), starts a container that imports torch and accelerate (a whole ``docker run``), and runs
    the example training (``docker run`` until its first epoch is printed). Where the pull time goes
    is measured apart, once per compression (:func:`pull_parts`): download, decompression and
    unpacking; what a pull takes beyond them is the engine's own work. Then an extra package on the zstd
    target: the bytes a push uploads, read from the registry.
    """
    name, platform = "nvidia-cu130", host_platform()
    gzip_ = setup_project(client, tmp / "gzip", host, made, repository="ml-bench-gzip", lock_from=project.root,
                          compression="gzip")
    lock_and_render(gzip_, [gzip_.target(name).on(platform)])
    made.refs += gzip_.target(name).on(platform).local_refs  # its tags in the engine (the zstd ones: main's)
    zstd_root = project.root
    edit_matrix(zstd_root, compression="zstd")
    zstd_ = load_project(zstd_root / "matrix.yaml")
    lock_and_render(zstd_, [zstd_.target(name).on(platform)])
    refs: dict[str, str] = {}
    for variant, root in (("zstd", zstd_root), ("gzip", gzip_.root)):
        say(f"fresh node: build and push {name} ({variant})")
        outcome = builder_build(root, name, "--push", "--platform", platform, smoke=True)[1]
        made.refs.append(outcome["content_tag"])
        made.ids.append(outcome["image_id"])
        refs[variant] = outcome["content_tag"]
    # The strong baseline's image of the same locks (bench/baseline/Dockerfile, gzip as Docker's default),
    # built as its users build it and pushed with `docker push`.
    say(f"fresh node: build and push {name} (the strong baseline)")
    pins, uv = locked_wheels(project, project.target(name).on(platform)), locks.tools_lock(project, platform)
    house = wheelhouse.location()
    context = baseline_context(tmp / "fresh-baseline", project.root, project.target(name).backend,
                               [house / p.filename for p in pins],
                               [f"{p.name}=={p.version} --hash=sha256:{p.sha256}" for p in pins],
                               [house / p.filename for p in uv],
                               [f"{p.name}=={p.version} --hash=sha256:{p.sha256}" for p in uv])
    refs["baseline"] = f"{host}/ml-bench-baseline:{name}-{os.getpid()}"
    made.refs.append(refs["baseline"])
    docker_cli_build(context, project.base_for(platform), project.target(name).backend, refs["baseline"])
    run([shutil.which("docker") or "docker", "push", "-q", refs["baseline"]], tmp)
    out: dict[str, Any] = {"target": name, "refs": refs, "layers": {}, "samples_s": {}, "where": {}}
    for variant, ref in refs.items():
        out["layers"][variant] = [size for _, size in registry_layers(ref)]
        out["where"][variant] = pull_parts(ref, "zstd" if variant == "zstd" else "gzip", tmp / f"blobs-{variant}")
        say(f"fresh node {variant}: {out['where'][variant]}")
    docker_cli = shutil.which("docker") or "docker"
    samples: dict[str, dict[str, list[float]]] = {k: {v: [] for v in refs} for k in ("pull", "import", "first_step")}
    for i in range(REPEATS):
        order = list(refs)[i % len(refs):] + list(refs)[:i % len(refs)]  # each variant first once
        for variant in order:
            with second_engine(tmp / f"node-{variant}-{i}") as node:
                docker_ = [docker_cli, "-H", node]
                figures = {
                    "pull": timed(functools.partial(run, [*docker_, "pull", "-q", refs[variant]], tmp))[0],
                    "import": timed(functools.partial(run, [*docker_, "run", "--rm", refs[variant], "python", "-c",
                                                            "import torch, accelerate"], tmp))[0],
                    "first_step": first_epoch([*docker_, "run", "--rm", refs[variant], "python",
                                               "/opt/examples/train.py", "--epochs", "2"]),
                }
            for key, seconds in figures.items():
                samples[key][variant].append(seconds)
            say(f"fresh node {variant} #{i + 1}: " + ", ".join(f"{k} {v} s" for k, v in figures.items()))
    for key, by_variant in samples.items():
        out["samples_s"][key] = by_variant
        out[f"{key}_s"] = {variant: median(values) for variant, values in by_variant.items()}
    out["pull_ratio"] = round(out["pull_s"]["zstd"] / out["pull_s"]["gzip"], 3)
    # Pull + first `import torch` on a fresh node, ours (zstd, the layer plan) over the strong baseline's image.
    out["pull_import_s"] = {v: round(out["pull_s"][v] + out["import_s"][v], 2) for v in refs}
    out["pull_import_ratio"] = round(out["pull_import_s"]["zstd"] / out["pull_import_s"]["baseline"], 3)

    # An extra package on the zstd target: only the packages layer may go to the registry.
    repository = refs["zstd"].rsplit(":", 1)[0]
    before = {digest for ref in refs.values() for digest, _ in registry_layers(ref)}
    doc = yaml.safe_load((zstd_root / "matrix.yaml").read_text())
    for t in doc["targets"]:
        if t["name"] == name:
            t["packages"] = [*t.get("packages", []), "einops==0.8.1"]
    edit_matrix(zstd_root, targets=doc["targets"])
    changed = load_project(zstd_root / "matrix.yaml")
    lock_and_render(changed, [changed.target(name).on(platform)])
    outcome = builder_build(zstd_root, name, "--push", "--platform", platform, smoke=True)[1]
    made.refs.append(outcome["content_tag"])
    made.ids.append(outcome["image_id"])
    new_bytes, all_bytes, positions = pushed_layers(outcome["content_tag"], before)
    out["extra_package"] = {"pushed_bytes": new_bytes, "image_bytes": all_bytes, "new_layers": positions,
                            "layers": len(registry_layers(outcome["content_tag"])), "repository": repository}
    say(f"extra package: {new_bytes} of {all_bytes} bytes pushed, new layers at {positions}")
    return out


def pull_parts(ref: str, compression: str, folder: Path) -> dict[str, float]:
    """Seconds to download every layer blob of *ref* from the registry (one after another, to a file),
    to decompress them all to /dev/null with the reference tool of *compression*, and to unpack them
    (decompress, ``tar -x`` onto this disk in layer order, ``sync``) less the decompression."""
    import urllib.request

    folder.mkdir(parents=True)
    repository = ref.rsplit(":", 1)[0]
    host, name = repository.split("/", 1)
    digests = [digest for digest, _ in registry_layers(ref)]
    blobs = [folder / digest.replace(":", "-") for digest in digests]

    def download() -> None:
        for digest, path in zip(digests, blobs, strict=True):
            with urllib.request.urlopen(f"http://{host}/v2/{name}/blobs/{digest}", timeout=600) as response, \
                    path.open("wb") as handle:
                shutil.copyfileobj(response, handle, 1 << 20)

    def decompress() -> None:
        for path in blobs:
            with path.open("rb") as source:
                subprocess.run([compression, "-dc"], stdin=source, stdout=subprocess.DEVNULL, check=True)

    def unpack() -> None:  # decompress and write the files, in layer order, as the engine applies them
        tree.mkdir()
        for path in blobs:
            with path.open("rb") as source:
                decompressor = subprocess.Popen([compression, "-dc"], stdin=source, stdout=subprocess.PIPE)
                subprocess.run(["tar", "-x", "--numeric-owner", "-C", str(tree)], stdin=decompressor.stdout,
                               check=True)
                if decompressor.wait() != 0:
                    raise RuntimeError(f"bench: {compression} -dc {path} exited {decompressor.returncode}")
        subprocess.run(["sync", "-f", str(tree)], check=True)

    tree = folder.parent / f"{folder.name}-tree"
    downloaded, _ = timed(download)
    decompressed, _ = timed(decompress)
    unpacked, _ = timed(unpack)
    shutil.rmtree(folder)
    shutil.rmtree(tree)
    return {"download_s": downloaded, "decompress_s": decompressed, "unpack_s": round(unpacked - decompressed, 2)}


def start_cost(project: Project, targets: list[ResolvedTarget], made: Made) -> dict[str, Any]:
    """What the entrypoint's contract check adds to a container start: ``docker run --rm IMAGE true``
    against ``docker run --rm --entrypoint /usr/bin/tini IMAGE -- true`` (whole commands, REPEATS
    each, alternating, after one warm-up run of each), on images built as users build them."""
    docker_cli = shutil.which("docker") or "docker"
    out: dict[str, Any] = {"checked_s": {}, "bare_s": {}, "added_s": {}, "samples_s": {}}
    for t in targets:
        image = builder_build(project.root, t.name, "--platform", host_platform(), smoke=True)[1]["image_id"]
        made.ids.append(image)
        argv = {"checked": [docker_cli, "run", "--rm", image, "true"],
                "bare": [docker_cli, "run", "--rm", "--entrypoint", "/usr/bin/tini", image, "--", "true"]}
        samples: dict[str, list[float]] = {"checked": [], "bare": []}
        for command in argv.values():
            run(command, project.root)  # warm-up: page cache, first container of the image
        for i in range(REPEATS):
            for kind in (("checked", "bare") if i % 2 == 0 else ("bare", "checked")):
                samples[kind].append(timed(functools.partial(run, argv[kind], project.root))[0])
        out["samples_s"][t.name] = samples
        out["checked_s"][t.name], out["bare_s"][t.name] = median(samples["checked"]), median(samples["bare"])
        out["added_s"][t.name] = round(out["checked_s"][t.name] - out["bare_s"][t.name], 2)
        say(f"{t.name}: start with the check {samples['checked']} s, without {samples['bare']} s")
    return out


def emulated(client: docker.DockerClient, project: Project, made: Made) -> dict[str, Any]:
    """nvidia-cu130 on the foreign platform under qemu: one cold build (``--rebuild``) with the smoke
    test, as a user runs it, and its size against the essential bytes (base + installed wheels).

    The foreign base comes from the local engine when it is there (pushed to the bench registry,
    same digest), else ``--update-base`` bootstraps it under emulation (counted in the time).
    """
    host = host_platform()
    foreign = "linux/arm64" if host == "linux/amd64" else "linux/amd64"
    view = project.target("nvidia-cu130").on(foreign)
    base = project.base_for(foreign)
    pinned = base_pin(project.root, foreign)
    try:
        client.api.tag(pinned["reference"], base.split("@")[0], "bench-" + view.arch)
        made.borrowed.append(f"{base.split('@')[0]}:bench-{view.arch}")
        push_ref(client, made.borrowed[-1])
    except docker.errors.ImageNotFound:
        say(f"no local {foreign} base: the build bootstraps it under emulation")
    say(f"nvidia-cu130 ({foreign}): cold build under emulation, with the smoke test")
    seconds, outcome = builder_build(project.root, "nvidia-cu130", "--platform", foreign, "--rebuild",
                                     "--update-base", smoke=True)
    made.refs += [outcome["content_tag"]] if outcome.get("content_tag") else []
    made.ids += [outcome["image_id"]] if outcome.get("image_id") else []
    house = wheelhouse.location()
    essential = client.api.inspect_image(base)["Size"] + sum(
        installed_bytes(house / p.filename) for p in locked_wheels(project, view))
    size = outcome.get("size_bytes") or 0
    say(f"nvidia-cu130 ({foreign}): {seconds:.0f} s, smoke {outcome.get('smoke')}, {size / essential:.4f} of essential")
    return {"platform": foreign, "target": "nvidia-cu130", "seconds": round(seconds, 1), "smoke": outcome.get("smoke"),
            "notes": outcome.get("notes"), "error": outcome.get("error"), "image_bytes": size,
            "essential_bytes": essential, "size_ratio_vs_essential": round(size / essential, 4) if essential else None}


CYCLES = 10


def _index_wheel(root: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A pure wheel *name*==*version* (needing *requires*) on the PEP 503 index at *root*, its page rewritten."""
    import base64
    import hashlib
    import zipfile

    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    digest = lambda text: base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
    files[f"{info}/RECORD"] = "".join(f"{k},sha256={digest(v)},{len(v)}\n" for k, v in files.items()) + \
        f"{info}/RECORD,,\n"
    page = root / name.replace("_", "-")
    page.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(page / f"{name}-{version}-py3-none-any.whl", "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    links = "".join(f'<a href="{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a>\n'
                    for w in sorted(page.glob("*.whl")))
    (page / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")


def _du(paths: list[Path]) -> int:
    """Bytes on disk under *paths* (``du``: each hard-linked file once)."""
    existing = [str(p) for p in paths if p.exists()]
    if not existing:
        return 0
    proc = subprocess.run(["du", "-s", "-B1", "-c", *existing], capture_output=True, text=True, check=False)
    return int(proc.stdout.strip().splitlines()[-1].split()[0])


def _where(data_root: Path) -> dict[str, int]:
    """Bytes under each folder of the engine's data root two levels down (containerd's content store and
    snapshotter, BuildKit's records, dockerd's own): where a cycle's growth lands."""
    folders = [d for top in sorted(data_root.iterdir()) if top.is_dir()
               for d in ([top] if top.name != "containerd" else sorted(p for p in top.rglob("*") if p.is_dir()
                                                                        and len(p.relative_to(top).parts) == 2))]
    return {str(d.relative_to(data_root)): _du([d]) for d in folders}


def disk(project: Project, tmp: Path, cycles: int = CYCLES) -> dict[str, Any]:
    """The stores' disk over CYCLES cycles of "index gains a release -> one more cpu package -> build"
    (``builder build -t cpu``, smoke on, as users run it: each build gets its content tag), against after the first build, then after
    ``builder gc``. An empty second dockerd (its data root is the engine's stores, alone), a wheelhouse of
    this run's own (hard links to the user's for cpu's locked wheels), an index on loopback behind the
    host's pip sources; the relock after each change is the builder's own. ``builder gc`` runs as users
    run it (``--keep-days`` 7: nothing here is that old, so only what no clone can want goes)."""
    import http.server
    import threading

    from builder.images import gc
    from builder.images.resolve import pip_sources

    root = project.root
    house, index = tmp / "disk-house", tmp / "disk-index" / "simple"
    house.mkdir()
    cpu = project.target("cpu").on(host_platform())
    shared = wheelhouse.location()
    for pin in locked_wheels(project, cpu) + lockfile.read_lock(locks.shared_lock_path(project, "tools",
                                                                                        cpu.platform))[1]:
        if (shared / pin.filename).exists():
            os.link(shared / pin.filename, house / pin.filename)
    _index_wheel(index, "mlbench_dep", "1.0")
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(index.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sources = pip_sources()
    url = f"http://127.0.0.1:{server.server_address[1]}/simple"
    # A pip config file of its own, read last: PIP_EXTRA_INDEX_URL would lose to the host's files.
    (tmp / "disk-pip.conf").write_text(f"[global]\nextra-index-url = {' '.join([*sources.extra_index_urls, url])}\n")
    env = {"BUILDER_WHEELHOUSE": str(house), "XDG_CACHE_HOME": str(tmp / "disk-state"),
           "PIP_CONFIG_FILE": str(tmp / "disk-pip.conf")}
    out: dict[str, Any] = {"cycles": cycles, "samples_bytes": [], "stores": []}
    try:
        with second_engine(tmp / "disk-engine") as host:
            env["DOCKER_HOST"] = host
            data_root = next((tmp / "disk-engine").glob("dockerd-*")) / "root"
            client = docker.DockerClient(base_url=host, timeout=3600)

            def measure(label: str) -> int:
                os.environ.update(env)
                held = gc.collect(client, load_project(root / "matrix.yaml"), items=False).held
                total = _du([house, data_root, tmp / "disk-state"])
                where = _where(data_root)
                out["stores"].append({"after": label, "disk_bytes": total, **held, "data_root": where})
                say(f"disk after {label}: {total / 1e9:.3f} GB ({', '.join(f'{k} {v / 1e9:.3f} GB' for k, v in held.items())})")
                say("  data root: " + ", ".join(f"{k} {v / 1e9:.3f} GB" for k, v in where.items() if v > 1e6))
                return total

            saved = {k: os.environ.get(k) for k in env}
            try:
                packages: list[str] = []
                for cycle in range(cycles + 1):
                    if cycle:
                        _index_wheel(index, "mlbench_dep", f"1.{cycle}")  # the index gains a release
                        _index_wheel(index, f"mlbench_pkg{cycle}", "1.0", ("mlbench_dep>=1.0",))
                        packages.append(f"mlbench_pkg{cycle}==1.0")
                        doc = yaml.safe_load((root / "matrix.yaml").read_text())
                        for t in doc["targets"]:
                            if t["name"] == "cpu":
                                t["packages"] = [*t.get("packages", []), packages[-1]]
                        edit_matrix(root, targets=doc["targets"])
                    seconds, outcome = builder_build(root, "cpu", "--platform", cpu.platform, env=env, smoke=True)
                    if outcome.get("error"):
                        raise SystemExit(f"bench: disk cycle {cycle}: {outcome['error']}")
                    say(f"disk cycle {cycle}: {outcome['result']} in {seconds} s")
                    out["samples_bytes"].append(measure("the first build" if cycle == 0 else f"cycle {cycle}"))
                first, last = out["samples_bytes"][0], out["samples_bytes"][-1]
                gc_run = run([sys.executable, "-m", "builder", "gc"], cwd=root, env=env)
                out["gc_output"] = gc_run.stdout.splitlines()
                after = measure("builder gc")
                noop = builder_build(root, "cpu", "--platform", cpu.platform, env=env, smoke=True)[1]
                out.update(first_bytes=first, cycles_bytes=last, gc_bytes=after, ratio=round(last / first, 3),
                           ratio_after_gc=round(after / first, 3), noop_after_gc=noop["result"])
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
                client.close()
    finally:
        server.shutdown()
    return out


def goals(results: dict[str, Any], targets: list[str]) -> list[dict[str, Any]]:
    """Each goal, its figures and whether it was met (None: not measurable in this run)."""
    out = []

    def goal(name: str, met: bool | None, detail: str, **row: Any) -> None:
        out.append({"goal": name, "met": met, "detail": detail, **row})  # row: a line of the avoidance table

    if (a := results.get("avoidance")) is not None:
        for key, figure, limit, want in (("noop", "no-op `builder build -t T`", 1.0, "reused-local"),
                                         ("fresh_runner", "fresh runner: decide and skip", 3.0, "reused-registry")):
            for t in targets:
                s, kinds = a[f"{key}_s"][t], sorted(set(a[f"{key}_results"][t]))
                goal(f"{figure} {t} (smoke on) <= {limit:g} s", s <= limit and kinds == [want],
                     f"{s} s, result {'/'.join(kinds)}", figure=figure, target=t, seconds=s,
                     samples=a[f"{key}_samples_s"][t], want=f"<= {limit:g} s, {want}")
        for t in targets:
            s, steps = a["runtime_change_s"][t], ", ".join(a["runtime_change_steps"][t])
            goal(f"runtime/ change {t}: only the last stage rebuilt, smoke once", a["runtime_change_ok"][t],
                 f"{s} s, cached/total steps {steps} (before the last stage: {a['steps_before_last_stage'][t]})",
                 figure="runtime/ change: rebuild + smoke", target=t, seconds=f"{s} ({steps} cached/total)",
                 samples=a["runtime_change_samples_s"][t],
                 want=f"only the last stage rebuilt (the {a['steps_before_last_stage'][t]} steps before it "
                      "cached), smoke passed once")
        names, s = " ".join(a["make_images_targets"]), a["make_images_noop_s"]
        limit = 1.0 + len(a["make_images_targets"])
        goal(f"`make images` nothing changed (TARGETS={names}) <= {limit:g} s", s <= limit, f"{s} s",
             figure="`make images`, nothing changed (whole command)", target=f"TARGETS={names}", seconds=s,
             samples=a["make_images_noop_samples_s"], want=f"<= {limit:g} s (1 s + 1 s per target)")
    if (f := results.get("fresh_node")) is not None and "zstd" in f["pull_s"]:
        pull, start, step = f["pull_s"], f["import_s"], f["first_step_s"]
        goal(f"fresh-node pull of {f['target']}, zstd <= 0.6 x the gzip layer plan", f["pull_ratio"] <= 0.6,
             f"{pull['zstd']} s vs {pull['gzip']} s ({f['pull_ratio']} x)")
        if "pull_import_ratio" in f:
            both = f["pull_import_s"]
            goal(f"fresh-node pull + first `import torch` of {f['target']}, ours (zstd) <= 0.6 x the strong "
                 "baseline's image (gzip)", f["pull_import_ratio"] <= 0.6,
                 f"{both['zstd']} s vs {both['baseline']} s ({f['pull_import_ratio']} x)")
        goal("first `import torch, accelerate` in a new container no slower (within 5 %)",
             start["zstd"] <= 1.05 * start["gzip"], f"{start['zstd']} s vs {start['gzip']} s")
        goal("example training: new container to its first epoch, no slower (within 5 %)",
             step["zstd"] <= 1.05 * step["gzip"], f"{step['zstd']} s vs {step['gzip']} s")
        extra = f["extra_package"]
        goal("extra package on a CUDA target: only the packages layer pushed",
             extra["new_layers"] == [extra["layers"] - 1],
             f"{extra['pushed_bytes']} of {extra['image_bytes']} bytes; new layers at {extra['new_layers']} "
             f"of {extra['layers']}")
    if (d := results.get("disk")) is not None:
        goal(f"stores' disk after {d['cycles']} cycles (index release, one more cpu package, build) <= 1.2 x "
             "after the first build", d["ratio"] <= 1.2,
             f"{d['cycles_bytes'] / 1e9:.3f} GB vs {d['first_bytes'] / 1e9:.3f} GB ({d['ratio']} x)")
        goal("... and after `builder gc` <= 1.05 x, the next build reused", d["ratio_after_gc"] <= 1.05
             and d["noop_after_gc"] == "reused-local",
             f"{d['gc_bytes'] / 1e9:.3f} GB ({d['ratio_after_gc']} x), next build {d['noop_after_gc']}")
    if (c := results.get("start")) is not None:
        for t, added in c["added_s"].items():  # the goal is the cpu image's; the others are reported
            goal(f"container start: the contract check adds <= 0.3 s ({t})" if t == "cpu" else
                 f"container start: what the contract check adds ({t}, reported)",
                 added <= 0.3 if t == "cpu" else None,
                 f"{c['checked_s'][t]} s vs {c['bare_s'][t]} s without it: +{added} s")
    if "baseline" not in results:
        return out
    base = results["baseline"]
    for t in targets:
        ours_s, their_s = results["cold_build_s"][t], base["cold_build_s"][t]
        limit = COLD_GOAL.get(t, COLD_GOAL["cpu"])
        goal(f"cold build {t} <= {limit} x the strong baseline", ours_s <= limit * their_s,
             f"{ours_s} s vs {their_s} s ({ours_s / their_s:.2f} x)")
    for t in targets:
        s = results["noop_rebuild_s_per_target"][t]
        goal(f"no-op rebuild --no-smoke {t} <= 1 s", s <= 1.0 and results["noop_all_cached"][t],
             f"{s} s, every step from cache: {results['noop_all_cached'][t]}")
    fraction = results["shared_fraction_below_torch"]
    goal("shared fraction below torch = 1.0", None if fraction is None else fraction == 1.0,
         "needs two targets" if fraction is None else f"{fraction}")
    for t in targets:
        r = results["size_ratio_vs_essential"][t]
        goal(f"size {t} <= 1.10 x essential", r <= 1.10, f"{r} x")
    for t in targets:
        s = results["runtime_change_rebuild_s"][t]
        goal(f"runtime-change rebuild {t} <= 15 s", s <= 15.0, f"{s} s")
    for key, better in (("cold_build_s", min), ("noop_rebuild_s_per_target", min),
                        ("runtime_change_rebuild_s", min), ("size_ratio_vs_essential", min)):
        for t in targets:
            mine, theirs = results[key][t], base[key][t]
            goal(f"{key} {t} at least as good as baseline", better(mine, theirs) == mine, f"{mine} vs {theirs}")
    for key in ("shared_bytes_fraction", "shared_fraction_below_torch"):
        mine, theirs = results[key], base[key]
        goal(f"{key} at least as good as baseline", None if mine is None else mine >= theirs, f"{mine} vs {theirs}")
    return out


def markdown(results: dict[str, Any], targets: list[str]) -> str:
    """results.md: build avoidance (the headline, with its goals), the figures ours vs. baseline, all goals."""
    mark = {True: "yes", False: "**no**", None: "n/a"}
    rows = []
    if "avoidance" in results:
        rows += ["Build avoidance, as users run it (smoke on, whole process, median of 3):", "",
                 "| figure | target | seconds | samples (s) | goal | met |", "|---|---|---:|---|---|---|"]
        rows += [f"| {g['figure']} | {g['target']} | {g['seconds']} | {g['samples']} | {g['want']} | "
                 f"{mark[g['met']]} |" for g in results["goals"] if "figure" in g]
        rows.append("")
    if (e := results.get("emulated")) is not None:
        rows += [f"{e['target']} on {e['platform']} under qemu emulation (one cold build, `--rebuild`, smoke on):", "",
                 "| wall time (s) | smoke | image (GB) | essential (GB) | size / essential | notes |",
                 "|---:|---|---:|---:|---:|---|",
                 (f"| {e['seconds']} | {e['smoke']}{' ' + str(e['error']) if e['error'] else ''} | "
                 f"{e['image_bytes'] / 1e9:.3f} | {e['essential_bytes'] / 1e9:.3f} | {e['size_ratio_vs_essential']} | "
                 f"{'; '.join(e['notes'] or [])} |"), ""]
    if (f := results.get("fresh_node")) is not None and "zstd" in f["pull_s"]:
        rows += [(f"{f['target']} on a fresh node (an empty second dockerd pulling from the local registry; whole "
                  "commands, median of 3, alternating), the layer plan with zstd and with gzip layers:"), "",
                 "| figure | zstd (s) | gzip (s) | samples: zstd / gzip (s) |", "|---|---:|---:|---|"]
        rows += [f"| {label} | {f[key + '_s']['zstd']} | {f[key + '_s']['gzip']} | "
                 f"{f['samples_s'][key]['zstd']} / {f['samples_s'][key]['gzip']} |"
                 for key, label in (("pull", "`docker pull`"), ("import", "`docker run` import torch, accelerate"),
                                    ("first_step", "`docker run` example training, to its first epoch"))]
        rows += [(f"| of the pull: download, blobs one after another | {f['where']['zstd']['download_s']} | "
                 f"{f['where']['gzip']['download_s']} | once each |"),
                 (f"| of the pull: decompression, `zstd -dc` / `gzip -dc` | {f['where']['zstd']['decompress_s']} | "
                 f"{f['where']['gzip']['decompress_s']} | once each |"),
                 (f"| of the pull: unpacking, `tar -x` in layer order and `sync`, less decompression | "
                 f"{f['where']['zstd'].get('unpack_s')} | {f['where']['gzip'].get('unpack_s')} | once each |")]
        if "baseline" in f["pull_s"]:
            rows += [f"| the strong baseline's image (gzip): {label} | | {f[key + '_s']['baseline']} | "
                     f"{f['samples_s'][key]['baseline']} |"
                     for key, label in (("pull", "`docker pull`"), ("import", "`docker run` import torch, accelerate"))]
            rows += [(f"| pull + first import: ours (zstd) / the strong baseline's image | {f['pull_import_s']['zstd']} | "
                      f"{f['pull_import_s']['baseline']} | {f['pull_import_ratio']} x |")]
        layers_mb = {k: [round(v / 1e6) for v in sizes] for k, sizes in f["layers"].items()}
        rows += ["", f"Compressed layers (MB): zstd {layers_mb['zstd']}; gzip {layers_mb['gzip']}.", ""]
    if (c := results.get("start")) is not None:
        rows += [("Container start (`docker run --rm IMAGE true` vs `--entrypoint /usr/bin/tini`, whole commands, "
                 "median of 3):"), "", ("| target | with the check (s) | without (s) | added (s) | samples: with / "
                 "without (s) |"), "|---|---:|---:|---:|---|"]
        rows += [f"| {t} | {c['checked_s'][t]} | {c['bare_s'][t]} | {c['added_s'][t]} | "
                 f"{c['samples_s'][t]['checked']} / {c['samples_s'][t]['bare']} |" for t in c["added_s"]]
        rows.append("")
    if "baseline" in results:
        rows += baseline_table(results, targets)
    rows += ["| goal | met | figures |", "|---|---|---|"]
    rows += [f"| {g['goal']} | {mark[g['met']]} | {g['detail']} |" for g in results["goals"]]
    rows.append("")
    rows += [AVOIDANCE_NOTES] if "avoidance" in results else []
    rows += [NOTES.format(**results)] if "baseline" in results else [HOW.format(**results)]
    return "\n".join(rows) + "\n"


def baseline_table(results: dict[str, Any], targets: list[str]) -> list[str]:
    """The figures ours vs. baseline, one row per metric and target."""
    base = results["baseline"]
    rows = ["| metric | target | ours | baseline |", "|---|---|---:|---:|"]
    per_target = [("cold build, --no-smoke (s, median of 3, no layer cache)", "cold_build_s"), ("no-op rebuild, --no-smoke (s, median of 3)",
                  "noop_rebuild_s_per_target"), ("runtime-change rebuild, --no-smoke (s, median of 3)",
                  "runtime_change_rebuild_s"), ("image size (GB)", "image_bytes"),
                  ("essential size (GB)", "essential_bytes"), ("size / essential", "size_ratio_vs_essential")]
    for t in targets:  # where the cold build's time went
        for phase in sorted({*results.get("cold_phases_s", {}).get(t, {}), *base.get("cold_phases_s", {}).get(t, {})}):
            rows.append(f"| of the cold build: BuildKit's {phase} (s, median) | {t} | "
                        f"{results['cold_phases_s'].get(t, {}).get(phase, 0)} | "
                        f"{base['cold_phases_s'].get(t, {}).get(phase, 0)} |")
    for label, key in per_target:
        for t in targets:
            a, b = results[key][t], base[key][t]
            if key.endswith("bytes"):
                a, b = f"{a / 1e9:.3f}", f"{b / 1e9:.3f}"
            rows.append(f"| {label} | {t} | {a} | {b} |")
    shared = [results["shared_bytes"], base["shared_bytes"]]
    rows.append("| bytes shared between targets (GB) | all | "
                + " | ".join("None" if b is None else f"{b / 1e9:.3f}" for b in shared) + " |")
    for label, key in (("bytes shared between targets / total", "shared_bytes_fraction"),
                       ("bytes below torch shared by all targets", "shared_fraction_below_torch")):
        rows.append(f"| {label} | all | {results[key]} | {base[key]} |")
    return [*rows, ""]


HOW = "How measured ({cpus} CPUs, engine {engine}, {seconds} s in all; timings on a shared engine are noisy)."
AVOIDANCE_NOTES = """Build avoidance: every figure is the wall time of the whole process with the smoke test on, on the
temporary copy. No-op = `builder build -t T -q --json` right after a smoke-tested build of the same content (its
content tag is local: reused-local). Fresh runner = the same command with DOCKER_HOST at a second, empty dockerd
started for the bench, the content tag pushed to the bench's registry (reused-registry: nothing pulled or built).
runtime/ change = a comment appended to runtime/ml_runtime/__init__.py, then `builder build -t T -q --json`
(smoke on); cached/total counts the build's steps without FROM lines. `make images` = `make images TARGETS=...`
in the copy (this checkout's Makefile and venv; `install` and `host` run too), nothing changed."""
NOTES = HOW[:-1] + """:
cold = the whole `builder build -t T --rebuild --no-smoke -q --json` process (zstd) against the whole `docker buildx
build --no-cache` of the baseline (gzip), medians of 3, interleaved per target; no-op = wall time of
the whole `builder build -t T --no-smoke -q --json` process (baseline: `docker buildx build` of its Dockerfile,
the wheels bind-mounted from its `wheels` named context, gzip as Docker's default); runtime change = a comment appended to
runtime/ml_runtime/__init__.py in the temporary copy, then the same rebuild. Sizes and sharing are taken from
the images an ordinary cached build leaves tagged; essential = base root fs + uncompressed size of the locked
wheels (common.lock + the target's lock). "Below torch" = the layers under the first one that takes
target-specific input (ours: the first layer of the plan; baseline: the RUN that installs uv and its wheels)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="cpu,nvidia-cu130", help="comma-separated targets (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="cpu only, for trying the bench out")
    parser.add_argument("--cycles", type=int, default=CYCLES, help="the disk row's cycles (default: %(default)s)")
    parser.add_argument("--out", default=str(REPO / "bench" / "out"), help="output folder (default: bench/out)")
    parser.add_argument("--only", type=lambda v: [x.strip() for x in v.split(",") if x.strip()], default=None,
                        help="comma-separated rows: " + ", ".join(ROWS) + " (baseline: cold, no-op and "
                        "runtime-change builds against the one-Dockerfile baseline, sizes, sharing; avoidance: the "
                        "build-avoidance ones; emulated: nvidia-cu130 on the foreign platform under qemu; fresh-node: "
                        "nvidia-cu130 pulled and started on an empty engine, zstd vs gzip layers; start: what the "
                        "contract check adds to a container start; disk: the builder's stores over 10 cycles of index release, "
                        "one more cpu package, build, then builder gc); the other rows of --out are kept")
    args = parser.parse_args(argv)
    if args.only is not None and (unknown := sorted(set(args.only) - set(ROWS))):
        parser.error(f"--only: unknown rows {', '.join(unknown)}; choose from {', '.join(ROWS)}")
    rows = args.only or list(ROWS)
    names = ["cpu"] if args.quick else [n.strip() for n in args.targets.split(",") if n.strip()]
    client = connect()
    made = Made(client)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ml-bench-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            with registry(tmp / "registry") as host:
                project = setup_project(client, tmp / "project", host, made)
                targets = [project.target(n) for n in names]
                made.refs += [ref for t in targets for view in t.views() for ref in view.local_refs]
                lock_and_render(project, targets)
                results = measure(client, project, targets, tmp, made) if "baseline" in rows else {}
                if "avoidance" in rows:
                    results["avoidance"] = avoidance(project, targets, tmp, made)
                if "emulated" in rows:
                    results["emulated"] = emulated(client, project, made)
                if "start" in rows:
                    results["start"] = start_cost(project, targets, made)
                if "fresh-node" in rows:
                    results["fresh_node"] = fresh_node(client, project, host, tmp, made)
                if "disk" in rows:
                    results["disk"] = disk(project, tmp, args.cycles)
        finally:
            made.close()
    out = Path(args.out)
    previous = out / "results.json"
    if args.only and previous.exists():  # --only re-measures its rows and keeps the others
        results = {**json.loads(previous.read_text()), **results}
        names = [*results["targets"], *(n for n in names if n not in results["targets"])]
    results = {**results, "targets": names, "engine": client.version()["Version"], "cpus": os.cpu_count(),
               "seconds": round(time.monotonic() - started, 1)}
    results["goals"] = goals(results, names)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results, names))
    print((out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as exc:
        sys.exit(f"bench: {exc}")
