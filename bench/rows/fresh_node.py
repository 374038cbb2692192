"""The fresh-node row: nvidia-cu130 pulled and started on an empty engine, the layer plan with zstd
against gzip layers and the strong baseline's image; then the bytes an extra package pushes."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import docker
import yaml

from bench import REPEATS, median, run, say, second_engine, timed
from bench.project import (
    Made,
    Project,
    baseline_for,
    builder_build,
    docker_cli_build,
    load,
    lock_and_render,
    setup_project,
)
from devtools.support import auth_header, edit_matrix, host_platform, registry_layers


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
    gzip_root = setup_project(client, tmp / "gzip", host, made, repository="ml-bench-gzip",
                              lock_from=project.root, compression="gzip")
    gzip_ = lock_and_render(gzip_root, [load(gzip_root).target(name).on(platform)])
    made.refs += gzip_.target(name).on(platform).local_refs  # its tags in the engine (the zstd ones: main's)
    zstd_root = project.root
    edit_matrix(zstd_root, compression="zstd")
    lock_and_render(zstd_root, [load(zstd_root).target(name).on(platform)])
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
    context = baseline_for(project, project.target(name).on(platform), tmp / "fresh-baseline")
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
    lock_and_render(zstd_root, [load(zstd_root).target(name).on(platform)])
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
            request = urllib.request.Request(f"http://{host}/v2/{name}/blobs/{digest}", headers=auth_header(host))
            with urllib.request.urlopen(request, timeout=600) as response, \
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
