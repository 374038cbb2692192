"""The baseline row: cold, no-op and runtime-change builds, image sizes and layer sharing, ours (whole
``builder build`` processes) against the one-Dockerfile baseline (whole ``docker buildx build`` processes)."""

from __future__ import annotations

import os
from collections.abc import Callable
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


def measure(client: docker.DockerClient, project: Project, views: list[TargetView], tmp: Path,
            made: Made) -> dict[str, Any]:
    """Cold, no-op and runtime-change builds, sizes and sharing, ours against the baseline (bench/__main__.py)."""
    root = project.root
    house = wheelhouse(root)
    pins = {t.name: locked_wheels(project, t) for t in views}
    contexts = {t.name: baseline_for(project, t, tmp / f"baseline-{t.name}") for t in views}
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
    for t in views:
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
    tags = {t.name: f"{BASELINE_REPO}:{t.name}-{os.getpid()}" for t in views}
    for t in views:
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

    def paired(t: Target, prepare: Callable[[Target], None]) -> tuple[list[float], list[float], list[bool]]:
        """REPEATS rebuilds of *t*, ours then the baseline's, each after *prepare*: (ours s, theirs s, all cached)."""
        samples, theirs_samples, cached = [], [], []
        for _ in range(REPEATS):
            prepare(t)
            seconds, outcome = builder_build(root, t.name)
            samples.append(seconds)
            cached.append(outcome["cached_steps"] == outcome["steps"])
            made.ids.append(outcome["image_id"])
            seconds, image_id = docker_cli_build(contexts[t.name], base, t.backend, tags[t.name])
            theirs_samples.append(seconds)
            made.ids.append(image_id)
        return samples, theirs_samples, cached

    # No-op, then a runtime change (a comment in the in-image runtime): whole processes, ours the CLI,
    # the baseline `docker buildx build`.
    def changed(t: Target) -> None:  # the same change in both contexts
        touch_runtime(root)
        sync_runtime(root, contexts[t.name])

    for key, label, prepare in (("noop", "no-op", lambda t: None), ("runtime_change", "runtime change", changed)):
        for t in views:
            samples, theirs_samples, cached = paired(t, prepare)
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
    return {**ours, "baseline": theirs}
