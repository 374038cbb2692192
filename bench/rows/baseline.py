"""The baseline row: cold, no-op and runtime-change builds, image sizes and layer sharing, ours (whole
``builder build`` processes) against the one-Dockerfile baseline (whole ``docker buildx build`` processes)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker

from bench import (
    REPEATS,
    Layer,
    below,
    installed_bytes,
    layers,
    median,
    say,
    shared_by_all,
    shared_bytes,
    shared_fraction,
    sync_runtime,
)
from bench.project import (
    BASELINE_REPO,
    Made,
    Project,
    Target,
    TargetView,
    baseline_for,
    builder_build,
    docker_cli_build,
    docker_cli_build_phases,
    locked_wheels,
    touch_runtime,
    wheelhouse,
)
from devtools.support import host_platform

#: Where target-specific input first enters each stack: the first layer of the plan (ours), the
#: install of uv and the backend's wheels (baseline).
MARKERS = {"ours": 'if [ -n "$WHEELS_', "baseline": "requirements-uv.txt"}


@dataclass(frozen=True)
class _Bench:
    """What every build of the row needs: the engine, the project copy, the baseline's build contexts
    (per target), the base both sides build FROM, and the images made (removed at the end)."""

    client: docker.DockerClient
    root: Path
    contexts: dict[str, Path]
    base: str
    made: Made

    def baseline_build(self, t: Target, tag: str, *flags: str) -> tuple[float, str]:
        """The baseline's whole ``docker buildx build`` of *t*, tagged *tag*: its seconds and image."""
        return docker_cli_build(self.contexts[t.name], self.base, t.backend, tag, *flags)

    def change_runtime(self, t: Target) -> None:
        """A comment in the in-image runtime, in our project and in *t*'s baseline context alike."""
        touch_runtime(self.root)
        sync_runtime(self.root, self.contexts[t.name])


def measure(client: docker.DockerClient, project: Project, views: list[TargetView], tmp: Path,
            made: Made) -> dict[str, Any]:
    """Cold, no-op and runtime-change builds, sizes and sharing, ours against the baseline (bench/__main__.py)."""
    run = _Bench(client, project.root, {t.name: baseline_for(project, t, tmp / f"baseline-{t.name}") for t in views},
                 project.base_for(host_platform()), made)
    ours: dict[str, Any] = {k: {} for k in ("cold_build_s", "noop_rebuild_s_per_target", "noop_samples_s",
                                            "runtime_change_rebuild_s", "runtime_change_samples_s",
                                            "image_bytes", "essential_bytes", "size_ratio_vs_essential")}
    theirs: dict[str, Any] = {k: {} for k in ours}
    ours["noop_all_cached"] = {}
    ours["cold_samples_s"], theirs["cold_samples_s"] = {}, {}
    zstd: dict[str, Any] = {"cold_build_s": {}, "cold_samples_s": {}}
    for t in views:
        _cold(run, t, dict(zip(COLD_SIDES, (ours, theirs, zstd), strict=True)))
    tags = {t.name: f"{BASELINE_REPO}:{t.name}-{os.getpid()}" for t in views}
    stacks = _settle(run, project, views, tags, ours, theirs)
    # No-op, then a runtime change (a comment in the in-image runtime): whole processes, ours the CLI,
    # the baseline `docker buildx build`.
    for key, label, prepare in (("noop", "no-op", lambda t: None),
                                ("runtime_change", "runtime change", run.change_runtime)):
        for t in views:
            samples, theirs_samples, cached = _paired(run, t, tags[t.name], prepare)
            say(f"{t.name}: {label} {samples} s, baseline {theirs_samples} s")
            ours[f"{key}_samples_s"][t.name], theirs[f"{key}_samples_s"][t.name] = samples, theirs_samples
            rebuild = "noop_rebuild_s_per_target" if key == "noop" else "runtime_change_rebuild_s"
            ours[rebuild][t.name], theirs[rebuild][t.name] = median(samples), median(theirs_samples)
            if key == "noop":
                ours["noop_all_cached"][t.name] = all(cached)
    for side, name in ((ours, "ours"), (theirs, "baseline")):
        images = [stacks[name][t.name] for t in views]
        side["shared_bytes_fraction"] = shared_fraction(images)
        side["shared_bytes"] = shared_bytes(images)
        side["shared_fraction_below_torch"] = shared_by_all([below(s, MARKERS[name]) for s in images])
    return {**ours, "baseline": theirs, "baseline_zstd": zstd}


#: The sides of the cold row: ours, and the hand-written Dockerfile exported as Docker's default
#: (gzip) and as a strong engineer exports it today (zstd, one flag), each a whole process.
COLD_SIDES = ("ours", "baseline", "baseline_zstd")

#: The zstd baseline's exporter: the same options as ours (builder/oci/buildkit.py's compression_options).
ZSTD_OUTPUT = "type=image,compression=zstd,force-compression=true,oci-mediatypes=true"


def _cold(run: _Bench, t: TargetView, records: dict[str, dict[str, Any]]) -> None:
    """Cold builds of *t*: whole processes as users run them, no layer cache, REPEATS rounds
    (:func:`_rounds`): ours `builder build -t T --rebuild --no-smoke -q --json` (zstd, the default),
    the baseline `docker buildx build --no-cache` of its Dockerfile (gzip, Docker's) and the same
    exported with zstd, each with its wheel contexts in place (:func:`_prune_snapshots` first).
    Their seconds, and where the time went, go into *records* (per side)."""
    samples = _rounds(run, t, records, before=lambda side: _prune_snapshots())
    say(f"{t.name}: cold build {samples['ours']} s, baseline {samples['baseline']} s (gzip), "
        f"{samples['baseline_zstd']} s (zstd)")


def _rounds(run: _Bench, t: TargetView, records: dict[str, dict[str, Any]],
            before: Callable[[str], None] = lambda side: None) -> dict[str, list[float]]:
    """REPEATS rounds of one cold build of *t* per side of *records* (ours, baseline, baseline_zstd),
    each round's order rotated so every side sees the same load, each build after *before* (its
    side). Into each side's record: the samples, their median and, per phase, the median of BuildKit's
    seconds. Returns the samples per side."""
    sides = list(records)
    samples: dict[str, list[float]] = {side: [] for side in sides}
    phases: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for i in range(REPEATS):
        for who in sides[i % len(sides):] + sides[:i % len(sides)]:
            before(who)
            seconds, where = _cold_ours(run, t) if who == "ours" else _cold_baseline(run, t, who == "baseline_zstd")
            samples[who].append(seconds)
            phases[who].append(where)
    for side, record in records.items():
        record["cold_samples_s"][t.name] = samples[side]
        record.setdefault("cold_phases_s", {})[t.name] = {
            k: median([p.get(k, 0.0) for p in phases[side]]) for k in sorted({k for p in phases[side] for k in p})}
        record["cold_build_s"][t.name] = median(samples[side])
    return samples


def _cold_ours(run: _Bench, t: TargetView) -> tuple[float, dict[str, float]]:
    """One cold ``builder build``: its seconds and BuildKit's seconds per phase."""
    seconds, outcome = builder_build(run.root, t.name, "--rebuild", "--platform", t.platform)
    if outcome.get("error"):
        raise SystemExit(f"bench: cold build of {t.name}: {outcome['error']}")
    run.made.ids.append(outcome["image_id"])
    return seconds, outcome.get("phases") or {}


def _cold_baseline(run: _Bench, t: TargetView, zstd: bool) -> tuple[float, dict[str, float]]:
    """One cold build of the baseline (gzip, or *zstd*): its seconds and BuildKit's seconds per phase."""
    tag = f"{BASELINE_REPO}:{t.name}-cold{'-zstd' if zstd else ''}-{os.getpid()}"
    flags = ["--no-cache", *(["--output", ZSTD_OUTPUT] if zstd else [])]
    try:
        seconds, _, where = docker_cli_build_phases(run.contexts[t.name], run.base, t.backend, tag, *flags)
    finally:  # every round makes another (its times differ): nvidia-cu130's held ~9 GB each
        run.made.drop(tag)
    return seconds, where


def _settle(run: _Bench, project: Project, views: list[TargetView], tags: dict[str, str], ours: dict[str, Any],
            theirs: dict[str, Any]) -> dict[str, dict[str, list[Layer]]]:
    """One ordinary build each, as users run them (cached, tagged *tags* for the baseline): their sizes
    against the essential bytes (the base and the installed wheels) go into *ours* and *theirs*, and
    their layers are returned, per side and target, for the sharing figures (the cold builds rebuilt the
    shared stage per target, so their images share nothing)."""
    house = wheelhouse(run.root)
    stacks: dict[str, dict[str, list[Layer]]] = {"ours": {}, "baseline": {}}
    for t in views:
        run.made.refs.append(tags[t.name])
        final = {"ours": builder_build(run.root, t.name, "--platform", t.platform)[1]["image_id"],
                 "baseline": run.baseline_build(t, tags[t.name])[1]}
        run.made.ids += [final["ours"], final["baseline"]]
        essential = run.client.api.inspect_image(run.base)["Size"] + sum(
            installed_bytes(house / p.filename) for p in locked_wheels(project, t))
        for side, name in ((ours, "ours"), (theirs, "baseline")):
            stacks[name][t.name] = layers(run.client, final[name])
            side["image_bytes"][t.name] = run.client.api.inspect_image(final[name])["Size"]
            side["essential_bytes"][t.name] = essential
            side["size_ratio_vs_essential"][t.name] = round(side["image_bytes"][t.name] / essential, 4)
    return stacks


def _paired(run: _Bench, t: TargetView, tag: str,
            prepare: Callable[[Target], None]) -> tuple[list[float], list[float], list[bool]]:
    """REPEATS rebuilds of *t*, ours then the baseline's (tagged *tag*), each after *prepare*: (ours s,
    theirs s, all cached). Ours builds *t*'s platform alone, as the baseline does: nvidia-cu130 lists
    linux/arm64 too, whose rebuild under qemu would count in ours alone."""
    samples, theirs_samples, cached = [], [], []
    for _ in range(REPEATS):
        prepare(t)
        seconds, outcome = builder_build(run.root, t.name, "--platform", t.platform)
        samples.append(seconds)
        cached.append(outcome["cached_steps"] == outcome["steps"])
        run.made.ids.append(outcome["image_id"])
        seconds, image_id = run.baseline_build(t, tag)
        theirs_samples.append(seconds)
        run.made.ids.append(image_id)
    return samples, theirs_samples, cached


#: The sides of the pruned-contexts row: ours and the hand-written Dockerfile exported with zstd.
PRUNED_SIDES = ("ours", "baseline_zstd")
#: What BuildKit calls its copy of each side's wheel contexts: ours' ``wheels-<layer>``, the
#: hand-written file's one ``wheels``.
WHEEL_COPIES = {"ours": "local source for wheels-", "baseline_zstd": "local source for wheels"}


def cold_pruned(project: Project, views: list[TargetView], tmp: Path, made: Made) -> dict[str, Any]:
    """Cold builds after the wheel contexts' copies were pruned (as BuildKit's GC and ``builder gc`` do):
    before each build, BuildKit's copies of that side's wheel contexts are removed by ID, so the build
    sends its wheels again (ours on the containerd store has none: its contexts are images, read in place); REPEATS rounds, each round's order rotated, whole processes as in the cold
    row (:func:`_cold`). The copies pruned are every clone's of those context names on this engine:
    another clone's next build sends them again, nothing else."""
    client = docker.from_env(timeout=3600)
    run = _Bench(client, project.root, {t.name: baseline_for(project, t, tmp / f"pruned-{t.name}") for t in views},
                 project.base_for(host_platform()), made)
    out: dict[str, Any] = {side: {"cold_build_s": {}, "cold_samples_s": {}, "cold_phases_s": {}, "pruned": {}}
                           for side in PRUNED_SIDES}
    for t in views:
        for side in PRUNED_SIDES:
            out[side]["pruned"][t.name] = []

        def prune(side: str, t: TargetView = t) -> None:
            _prune_snapshots()
            out[side]["pruned"][t.name].append(_prune_copies(client, WHEEL_COPIES[side], exact=side != "ours"))

        samples = _rounds(run, t, out, before=prune)
        say(f"{t.name}: cold build, wheel contexts pruned first: {samples['ours']} s, "
            f"baseline (zstd) {samples['baseline_zstd']} s")
    return out


def _prune_snapshots() -> None:
    """Remove the build cache's snapshots (its ``regular`` records: the layers earlier builds made or
    read), which a ``--no-cache`` build does not use, keeping the contexts' copies. Each cold build of
    nvidia-cu130 adds ~6 GB of them: unpruned, a round's three builds overran the cache's 30 GB cap,
    and BuildKit's GC, running during the next build, dropped the least recently used records, the
    wheel contexts of whichever side had built longest ago among them, so the row measured contexts
    sent again where it means them in place (docs/speed.md). Every build's cache on this engine,
    whoever made it, as the pruned row's copies."""
    subprocess.run(["docker", "buildx", "prune", "--force", "--filter", "type=regular"], capture_output=True,
                   check=False)


def _prune_copies(client: docker.DockerClient, description: str, exact: bool) -> int:
    """Remove BuildKit's copies whose description is *description* (or, not *exact*, starts with it);
    how many went. A copy in use by another build stays (BuildKit keeps it), and is not counted."""
    def copies() -> set[str]:
        api = client.api  # API 1.42+: ?type= lists the build cache alone (docker-py's df() takes no type)
        answer = api._result(api._get(api._url("/system/df"), params={"type": "build-cache"}), json=True)
        return {r["ID"] for r in answer.get("BuildCache") or () if r.get("Type") == "source.local" and (
            r.get("Description") == description if exact else str(r.get("Description")).startswith(description))}
    before = copies()
    for record in before:  # buildx 0.13's prune filters are ANDed: one record a call
        subprocess.run(["docker", "buildx", "prune", "--force", "--filter", f"id={record}"], capture_output=True,
                       check=False)
    return len(before - copies())
