"""The start and emulated rows: what the entrypoint's contract check adds to a container start, and
nvidia-cu130 built on the foreign platform under qemu."""

from __future__ import annotations

import functools
import shutil
from typing import Any

import docker

from bench import REPEATS, installed_bytes, median, run, say, timed
from bench.project import Made, Project, Target, builder_build, locked_wheels, wheelhouse
from devtools.support import base_pin, host_platform


def start_cost(project: Project, targets: list[Target], made: Made) -> dict[str, Any]:
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
        run([shutil.which("docker") or "docker", "push", "-q", made.borrowed[-1]], project.root)
    except docker.errors.ImageNotFound:
        say(f"no local {foreign} base: the build bootstraps it under emulation")
    say(f"nvidia-cu130 ({foreign}): cold build under emulation, with the smoke test")
    seconds, outcome = builder_build(project.root, "nvidia-cu130", "--platform", foreign, "--rebuild",
                                     "--update-base", smoke=True)
    made.refs += [outcome["content_tag"]] if outcome.get("content_tag") else []
    made.ids += [outcome["image_id"]] if outcome.get("image_id") else []
    house = wheelhouse(project.root)
    essential = client.api.inspect_image(base)["Size"] + sum(
        installed_bytes(house / p.filename) for p in locked_wheels(project, view))
    size = outcome.get("size_bytes") or 0
    say(f"nvidia-cu130 ({foreign}): {seconds:.0f} s, smoke {outcome.get('smoke')}, {size / essential:.4f} of essential")
    return {"platform": foreign, "target": "nvidia-cu130", "seconds": round(seconds, 1), "smoke": outcome.get("smoke"),
            "notes": outcome.get("notes"), "error": outcome.get("error"), "image_bytes": size,
            "essential_bytes": essential, "size_ratio_vs_essential": round(size / essential, 4) if essential else None}
