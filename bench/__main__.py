"""``python -m bench``: cold, no-op and runtime-change builds, image size and layer sharing, ours vs. baseline.

Writes bench/out/results.json and bench/out/results.md (and, as each row ends, the figures so far to
bench/out/results.partial.json, removed once those are written). Runs on a temporary copy of the project
(own registry on a free loopback port, own wheel-server port) and removes every image it made.

Build avoidance (content tags), measured as users run it, smoke test on: a no-op ``builder build``
(reused-local), a fresh runner deciding to skip (an empty second dockerd, the image in the
registry: reused-registry), a runtime/ change (rebuild + smoke) and ``make images`` with nothing
changed. ``--only avoidance`` runs just those rows (one cold build per target first).

Contexts pruned (``--only cold-pruned``): cold builds, ours against the hand-written Dockerfile exported
with zstd, each after BuildKit's copies of its wheel contexts were pruned (as its GC and ``builder gc``
do), so the hand-written file sends its wheels again; ours sends them again where they are folders
(podman aside: the classic store), and on the containerd store reads them from their images, which
no prune removes (its count of copies pruned is then 0).

Bounded state (``--only disk``): on an empty second dockerd, with a wheelhouse of its own and a local
index on loopback, the disk the builder's stores hold after 10 cycles of "the index gains a release of a
shared dependency, cpu gets one more package that needs it, build" against after the first build, then
after ``builder gc``.

Example:
    $ python -m bench --quick                          # cpu only, for trying it out
    $ python -m bench --targets cpu,nvidia-cu130       # the full run (several GB, ~20 min)
    $ python -m bench --only avoidance --targets cpu   # only the build-avoidance rows (~6 min)
    $ python -m bench --only cold-pruned               # cold builds after the contexts' copies were pruned
    $ python -m bench --only disk                      # the stores' disk over 10 cycles, then gc (~15 min)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker

from bench import registry
from bench.project import Made, Project, Target, load, lock_and_render, setup_project
from bench.report import goals, markdown
from bench.rows.avoidance import avoidance
from bench.rows.baseline import cold_pruned, measure
from bench.rows.disk import CYCLES, disk
from bench.rows.fresh_node import fresh_node
from bench.rows.start import emulated, start_cost
from devtools.support import REPO

#: The rows ``--only`` can pick, in the order they run.
ROWS = ("baseline", "cold-pruned", "avoidance", "emulated", "start", "fresh-node", "disk")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.only is not None and (unknown := sorted(set(args.only) - set(ROWS))):
        parser.error(f"--only: unknown rows {', '.join(unknown)}; choose from {', '.join(ROWS)}")
    # A user's builder runs from compiled bytecode after its first start; with this set (some CI images
    # and sandboxes do) every whole-process row would time Python compiling the builder's sources too.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    names = ["cpu"] if args.quick else [n.strip() for n in args.targets.split(",") if n.strip()]
    client = docker.from_env(timeout=3600)
    started = time.monotonic()
    partial = Path(args.out) / "results.partial.json"
    results = _measure(client, parser, args.only or list(ROWS), names, args.cycles, partial)
    _write(Path(args.out), results, names, bool(args.only), client.version()["Version"], started)
    partial.unlink(missing_ok=True)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="cpu,nvidia-cu130", help="comma-separated targets (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="cpu only, for trying the bench out")
    parser.add_argument("--cycles", type=int, default=CYCLES, help="the disk row's cycles (default: %(default)s)")
    parser.add_argument("--out", default=str(REPO / "bench" / "out"), help="output folder (default: bench/out)")
    parser.add_argument("--only", type=lambda v: [x.strip() for x in v.split(",") if x.strip()], default=None,
                        help="comma-separated rows: " + ", ".join(ROWS) + " (baseline: cold, no-op and "
                        "runtime-change builds against the one-Dockerfile baseline, sizes, sharing; cold-pruned: cold builds, ours "
                        "against the baseline exported with zstd, each after its wheel contexts' copies were pruned; avoidance: the "
                        "build-avoidance ones; emulated: nvidia-cu130 on the foreign platform under qemu; fresh-node: "
                        "nvidia-cu130 pulled and started on an empty engine, zstd vs gzip layers; start: what the "
                        "contract check adds to a container start; disk: the builder's stores over 10 cycles of index release, "
                        "one more cpu package, build, then builder gc); the other rows of --out are kept")
    return parser


def _measure(client: docker.DockerClient, parser: argparse.ArgumentParser, rows: list[str], names: list[str],
             cycles: int, partial: Path) -> dict[str, Any]:
    """The *rows* on a copy of the project with its own registry; every image made is removed after.
    The figures so far are in *partial* after each row: a run that stops (a full disk, Ctrl-C) keeps
    what it measured."""
    made = Made(client)
    with tempfile.TemporaryDirectory(prefix="ml-bench-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            with registry(tmp / "registry") as host:
                root = setup_project(client, tmp / "project", host, made)
                project = load(root)
                if unknown := [n for n in names if n not in project.targets]:
                    parser.error(f"--targets: no target {', '.join(unknown)} in matrix.yaml; choose from "
                                 f"{', '.join(project.targets)}")
                project = lock_and_render(root, [project.target(n).default_view for n in names])
                targets = [project.target(n) for n in names]
                made.refs += [ref for t in targets for view in t.views() for ref in view.local_refs]
                return _rows(client, project, targets, host, tmp, made, rows, cycles, partial)
        finally:
            made.close()


def _rows(client: docker.DockerClient, project: Project, targets: list[Target], host: str, tmp: Path, made: Made,
          rows: list[str], cycles: int, partial: Path) -> dict[str, Any]:
    """The figures of each of *rows*, in :data:`ROWS`' order (``baseline``'s at the top level), written
    to *partial* as each row ends."""
    views = [t.default_view for t in targets]  # each on its default platform: what was locked

    def keep(so_far: dict[str, Any]) -> None:
        partial.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text(json.dumps({**so_far, "targets": [t.name for t in targets]}, indent=2) + "\n")

    results = measure(client, project, views, tmp, made) if "baseline" in rows else {}
    keep(results)
    others: dict[str, Callable[[], Any]] = {
        "cold-pruned": lambda: cold_pruned(project, views, tmp, made),
        "avoidance": lambda: avoidance(project, targets, tmp, made),
        "emulated": lambda: emulated(client, project, made),
        "start": lambda: start_cost(project, targets, made),
        "fresh-node": lambda: fresh_node(client, project, host, tmp, made),
        "disk": lambda: disk(project, tmp, cycles),
    }
    for row in ROWS:
        if row in others and row in rows:
            results[row.replace("-", "_")] = others[row]()
            keep(results)
    return results


def _write(out: Path, results: dict[str, Any], names: list[str], only: bool, engine: str, started: float) -> None:
    """results.json and results.md in *out* (with ``--only``, over the rows it did not measure), and the
    markdown on stdout."""
    previous = out / "results.json"
    if only and previous.exists():  # --only re-measures its rows and keeps the others
        results = {**json.loads(previous.read_text()), **results}
        names = [*results["targets"], *(n for n in names if n not in results["targets"])]
    results = {**results, "targets": names, "engine": engine, "cpus": os.cpu_count(),
               "seconds": round(time.monotonic() - started, 1)}
    results["goals"] = goals(results, names)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results, names))
    print((out / "results.md").read_text())


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.CalledProcessError as exc:
        sys.exit(f"bench: {exc}")
