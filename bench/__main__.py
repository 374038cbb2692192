"""``python -m bench``: cold, no-op and runtime-change builds, image size and layer sharing, ours vs. baseline.

Writes bench/out/results.json and bench/out/results.md. Runs on a temporary copy of the project
(own registry on a free loopback port, own wheel-server port) and removes every image it made.

Example:
    $ python -m bench --quick                          # cpu only, for trying it out
    $ python -m bench --targets cpu,nvidia-cu130       # the full run (several GB, ~20 min)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import docker

from bench import (
    Layer,
    baseline_context,
    below,
    engine_build,
    installed_bytes,
    layers,
    median,
    registry,
    run,
    shared_by_all,
    shared_bytes,
    shared_fraction,
    sync_runtime,
    timed,
)
from builder.config.loaders import load_json
from builder.config.project import Project, ResolvedTarget, load_project
from builder.images import lockfile, locks, render, wheelhouse, wheelserver
from builder.images.build import build_labels
from builder.images.publish import push_ref
from builder.oci.engine import connect
from devtools.support import REPO, copy_project, edit_matrix, free_port, retarget_base_lock

REPEATS = 3
#: Where target-specific input first enters each stack: the lock's COPY (ours), the wheels' COPY (baseline).
MARKERS = {"ours": "requirements.lock", "baseline": " in /wheels"}
BASELINE_REPO = "ml-bench-baseline"


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


def setup_project(client: docker.DockerClient, root: Path, host: str, made: Made) -> Project:
    """Copy the project, point it at the private registry and a free wheel port, re-pin the base there."""
    copy_project(root)
    new_registry = f"{host}/ml-bench"
    edit_matrix(root, registry=new_registry, wheelhouse_port=free_port())
    lock = load_json(REPO / "base.lock.json")
    tag = f"{new_registry}/base:bench"
    client.api.tag(lock["image_id"], f"{new_registry}/base", "bench")
    made.borrowed.append(tag)
    digest = push_ref(client, tag)  # same layers, same config: same digest, so the pin stays exact
    retarget_base_lock(REPO, root, new_registry, digest)
    made.borrowed.append(f"{new_registry}/base@{digest}")
    return load_project(root / "matrix.yaml")


def locked_wheels(project: Project, target: ResolvedTarget) -> list[lockfile.Pin]:
    """The wheels that end up in the image: common.lock and the target's lock (uv's tools.lock does not)."""
    _, common = lockfile.read_lock(project.images_dir / "common.lock")
    _, own = lockfile.read_lock(project.root / target.lock)
    return common + own


def builder_build(root: Path, target: str) -> tuple[float, dict[str, Any]]:
    """Wall seconds of a whole ``builder build -t T --no-smoke -q`` process, and its JSON outcome."""
    exe = Path(sys.executable).parent / "builder"
    argv = [str(exe)] if exe.is_file() else [sys.executable, "-m", "builder"]
    seconds, proc = timed(lambda: run([*argv, "build", "-t", target, "--no-smoke", "-q", "--json"], cwd=root))
    return seconds, json.loads(proc.stdout)[0]


def docker_cli_build(context: Path, base: str, backend: str, tag: str) -> tuple[float, str]:
    """Wall seconds of the baseline's ``docker build`` (classic builder, as a user runs it) and the image ID."""
    argv = [shutil.which("docker") or "docker", "build", "-q", "--network", "host", "--build-arg", f"BASE={base}",
            "--build-arg", f"GPU_BACKEND={backend}", "-t", tag, str(context)]
    seconds, proc = timed(lambda: run(argv, cwd=context, env={"DOCKER_BUILDKIT": "0"}))
    return seconds, proc.stdout.strip().splitlines()[-1]


def touch_runtime(root: Path) -> None:
    """A comment appended to the runtime's __init__.py: the smallest change to the in-image code."""
    with (root / "runtime" / "ml_runtime" / "__init__.py").open("a") as handle:
        handle.write(f"# bench {time.time_ns()}\n")


def measure(client: docker.DockerClient, project: Project, targets: list[ResolvedTarget], tmp: Path,
            made: Made) -> dict[str, Any]:
    root = project.root
    say(f"locking {', '.join(t.name for t in targets)} (wheels into {wheelhouse.location()})")
    failed = locks.lock_all(project, targets, say)
    if failed:
        raise SystemExit(f"bench: locking failed: {failed}")
    render.write(render.render(project, targets))
    house = wheelhouse.location()
    pins = {t.name: locked_wheels(project, t) for t in targets}
    contexts = {t.name: baseline_context(tmp / f"baseline-{t.name}", root, t.backend,
                                         [house / p.filename for p in pins[t.name]],
                                         [f"{p.name}=={p.version}" for p in pins[t.name]]) for t in targets}
    base = project.base_ref
    ours: dict[str, Any] = {k: {} for k in ("cold_build_s", "noop_rebuild_s_per_target", "noop_samples_s",
                                            "runtime_change_rebuild_s", "runtime_change_samples_s",
                                            "image_bytes", "essential_bytes", "size_ratio_vs_essential")}
    theirs: dict[str, Any] = {k: {} for k in ours}
    ours["noop_all_cached"] = {}
    stacks: dict[str, dict[str, list[Layer]]] = {"ours": {}, "baseline": {}}

    # Cold: nocache, interleaved (ours, baseline, ours, ...) so both see the same load on the engine.
    with wheelserver.serve(house, project.matrix.wheelhouse_port) as wheels_at:
        for t in targets:
            say(f"{t.name}: cold build, ours")
            ours["cold_build_s"][t.name], ours_id = timed(functools.partial(
                engine_build, client, root, t.dockerfile, labels=build_labels(root), nocache=True,
                extra_hosts={wheelserver.HOST: wheels_at}))
            made.ids.append(ours_id)
            say(f"{t.name}: cold build, baseline")
            args = {"BASE": base, "GPU_BACKEND": t.backend}
            theirs["cold_build_s"][t.name], base_id = timed(functools.partial(
                engine_build, client, contexts[t.name], "Dockerfile", buildargs=args, nocache=True))
            made.ids.append(base_id)

    # Settle: one ordinary build each, as users run them (cached, tagged). Sizes and sharing are
    # measured on these: nocache rebuilt the shared stage per target, so its images share nothing.
    final: dict[str, dict[str, str]] = {"ours": {}, "baseline": {}}
    tags = {t.name: f"{BASELINE_REPO}:{t.name}-{os.getpid()}" for t in targets}
    for t in targets:
        made.refs += [*t.refs, tags[t.name]]
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


def goals(results: dict[str, Any], targets: list[str]) -> list[dict[str, Any]]:
    """Each goal, its figures and whether it was met (None: not measurable in this run)."""
    base = results["baseline"]
    out = []

    def goal(name: str, met: bool | None, detail: str) -> None:
        out.append({"goal": name, "met": met, "detail": detail})

    for t in targets:
        ours_s, their_s = results["cold_build_s"][t], base["cold_build_s"][t]
        goal(f"cold build {t} <= 0.6 x baseline", ours_s <= 0.6 * their_s,
             f"{ours_s} s vs {their_s} s ({ours_s / their_s:.2f} x)")
    for t in targets:
        s = results["noop_rebuild_s_per_target"][t]
        goal(f"no-op rebuild {t} <= 1 s", s <= 1.0 and results["noop_all_cached"][t],
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
    """results.md: one table of figures (ours, baseline) and one of goals."""
    base = results["baseline"]
    rows = ["| metric | target | ours | baseline |", "|---|---|---:|---:|"]
    per_target = [("cold build (s, nocache)", "cold_build_s"), ("no-op rebuild (s, median of 3)",
                  "noop_rebuild_s_per_target"), ("runtime-change rebuild (s, median of 3)",
                  "runtime_change_rebuild_s"), ("image size (GB)", "image_bytes"),
                  ("essential size (GB)", "essential_bytes"), ("size / essential", "size_ratio_vs_essential")]
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
    rows += ["", "| goal | met | figures |", "|---|---|---|"]
    for g in results["goals"]:
        met = {True: "yes", False: "**no**", None: "n/a"}[g["met"]]
        rows.append(f"| {g['goal']} | {met} | {g['detail']} |")
    rows += ["", NOTES.format(**results)]
    return "\n".join(rows) + "\n"


NOTES = """How measured ({cpus} CPUs, engine {engine}, {seconds} s in all; timings on a shared engine are noisy):
cold = docker-py classic build with nocache, ours and baseline interleaved per target; no-op = wall time of
the whole `builder build -t T --no-smoke -q --json` process (baseline: `docker build` of its Dockerfile,
which sends the wheels in its context every time); runtime change = a comment appended to
runtime/ml_runtime/__init__.py in the temporary copy, then the same rebuild. Sizes and sharing are taken from
the images an ordinary cached build leaves tagged; essential = base root fs + uncompressed size of the locked
wheels (common.lock + the target's lock). "Below torch" = the layers under the first one that takes
target-specific input (ours: COPY of the target's lock; baseline: COPY of its wheels)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="cpu,nvidia-cu130", help="comma-separated targets (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="cpu only, for trying the bench out")
    parser.add_argument("--out", default=str(REPO / "bench" / "out"), help="output folder (default: bench/out)")
    args = parser.parse_args(argv)
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
                results = measure(client, project, targets, tmp, made)
        finally:
            made.close()
    results = {"targets": names, "engine": client.version()["Version"], "cpus": os.cpu_count(),
               "seconds": round(time.monotonic() - started, 1), **results}
    results["goals"] = goals(results, names)
    out = Path(args.out)
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
