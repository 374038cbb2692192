"""The avoidance row: build avoidance as users run it (smoke on, whole processes): a no-op ``builder
build``, a fresh runner deciding to skip, a runtime/ change and ``make images`` with nothing changed."""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import REPEATS, median, run, say, second_engine, steps_before_last_stage, timed
from bench.project import Made, Project, Target, builder_build, touch_runtime
from devtools.support import REPO


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


def make_images(root: Path, targets: list[Target]) -> float:
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


def avoidance(project: Project, targets: list[Target], tmp: Path, made: Made) -> dict[str, Any]:
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

    def record(key: str, t: Target, samples: list[float], outcomes: list[dict[str, Any]]) -> None:
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
