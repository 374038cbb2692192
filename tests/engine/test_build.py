"""Real builds on the real engine: the cpu image end to end, cache, faults, interruption."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time

import pytest
from helpers import copy_project, edit_matrix, run_builder

pytestmark = pytest.mark.engine


def build_json(root, *args: str, env=None):
    proc = run_builder("build", "--json", "-q", *args, cwd=root, env=env)
    try:
        return proc, {o["target"]: o for o in json.loads(proc.stdout)}
    except json.JSONDecodeError:
        pytest.fail(f"no JSON from builder build (exit {proc.returncode}): {proc.stderr[-2000:]}")


def test_cpu_image_builds_and_passes_smoke(cpu_project, engine):
    proc, out = build_json(cpu_project, "-t", "cpu")
    assert proc.returncode == 0, proc.stderr[-2000:]
    cpu = out["cpu"]
    assert cpu["smoke"] == "passed" and cpu["error"] is None
    assert set(cpu["tags"]) == {"cpu", "cpu-torch2.13.0", "latest-cpu"}
    assert {"target", "tags", "image_id", "size_bytes", "seconds", "smoke"} <= set(cpu)
    # Nothing changed since the fixture built it: every step is a cache hit.
    assert cpu["cached_steps"] == cpu["steps"], cpu
    info = engine.api.inspect_image(cpu["image_id"])
    config = info["Config"]
    assert config["User"] == "1001:1001" and config["WorkingDir"] == "/workspace"
    assert config["Entrypoint"] == ["runtime-check", "exec", "--"]
    labels = config["Labels"]
    assert labels["io.ml-image-builder.torch"] == "2.13.0+cpu"
    assert len(labels["org.opencontainers.image.revision"]) >= 7
    assert labels["org.opencontainers.image.created"]
    repo = _registry_of(cpu_project)
    assert {f"{repo}:{t}" for t in ("cpu", "cpu-torch2.13.0", "latest-cpu")} <= set(info["RepoTags"])


def test_no_wheel_cache_or_credential_in_any_layer(cpu_project, engine, tmp_path):
    """docker save the image and read every layer above the base: no .whl, no pip/uv cache,
    no pip config or netrc. (The base is Debian's own packages: its python3-venv ships the
    ensurepip wheels under /usr/share/python-wheels, which are not ours.)"""
    repo = f"{_registry_of(cpu_project)}:cpu"
    base = json.loads((cpu_project / "base.lock.json").read_text())["image_id"]
    skip = len(engine.api.inspect_image(base)["RootFS"]["Layers"])
    archive = tmp_path / "image.tar"
    with archive.open("wb") as handle:
        for chunk in engine.api.get_image(repo):
            handle.write(chunk)
    bad, scanned = [], 0
    with tarfile.open(archive) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))
        for layer_name in manifest[0]["Layers"][skip:]:
            scanned += 1
            with tarfile.open(fileobj=outer.extractfile(layer_name)) as layer:
                for name in layer.getnames():
                    if (name.endswith((".whl", ".netrc")) or "/.cache/pip" in name or "/.cache/uv" in name
                            or name.startswith("tmp/uv/") or "pip.conf" in name):
                        bad.append(name)
    assert scanned >= 4, "expected the common, torch and runtime layers"
    assert not bad, bad[:10]


def test_unreachable_index_fails_cleanly_while_others_build(cpu_project):
    proc, out = build_json(cpu_project, "-t", "cpu", "-t", "amd-rocm5.7", "--keep-going", "--no-smoke")
    assert proc.returncode == 1
    assert out["cpu"]["error"] is None and out["cpu"]["image_id"]
    err = out["amd-rocm5.7"]["error"]
    assert "https://download.pytorch.org/whl/rocm5.7" in err
    assert "BUILDER_INDEX_ROCM5_7=URL" in err and "--index rocm5.7=URL" in err
    assert "Traceback" not in proc.stderr


def test_no_engine_is_one_line_exit_2(project):
    proc = run_builder("build", "-t", "cpu", cwd=project, env={"DOCKER_HOST": "unix:///tmp/no-such-docker.sock"})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "DOCKER_HOST" in lines[0] and "unix:///tmp/no-such-docker.sock" in lines[0]


def test_ctrl_c_mid_build_leaves_nothing_and_resumes(cpu_project, engine, tmp_path):
    """SIGINT during a RUN step: exit 130, no container left, the old tag kept, next run resumes."""
    root = copy_project(tmp_path / "p")
    repo = _registry_of(cpu_project) + "-interrupt"  # its own tags: other tests keep theirs
    edit_matrix(root, registry=repo)
    lock = json.loads((cpu_project / "base.lock.json").read_text())
    (root / "base.lock.json").write_text(json.dumps({**lock, "reference": lock["reference"].replace(
        _registry_of(cpu_project) + "/base", repo + "/base")}))
    engine.api.tag(lock["image_id"], repo + "/base", "bookworm")
    engine.api.push(repo + "/base", "bookworm")  # same layers, same digest: the lock holds for this repo
    try:
        _interrupt_and_resume(root, repo, engine)
    finally:
        for image in engine.images.list(name=repo):
            for tag in image.tags:  # the same image may carry other tests' tags: only ours go
                if tag.startswith(repo + ":"):
                    engine.api.remove_image(tag, noprune=True)


def _interrupt_and_resume(root, repo, engine):
    first, _ = build_json(root, "-t", "cpu", "--no-smoke")
    assert first.returncode == 0, first.stderr[-2000:]
    old = engine.api.inspect_image(f"{repo}:cpu")["Id"]
    with (root / "runtime/ml_runtime/__init__.py").open("a") as handle:
        handle.write(f"\n# cache buster {time.time()}\n")
    before = {c.id for c in engine.containers.list(all=True)}
    proc = subprocess.Popen([sys.executable, "-m", "builder", "build", "-t", "cpu", "--no-smoke"], cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ.copy())
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "--no-build-isolation" in line:  # the runtime's RUN step has started
            time.sleep(1.0)
            proc.send_signal(signal.SIGINT)
            break
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(seen[-20:]) + rest
    assert "Traceback" not in rest
    time.sleep(1)
    left = {c.id for c in engine.containers.list(all=True)} - before
    assert not left, f"{len(left)} containers left after Ctrl-C"
    assert engine.api.inspect_image(f"{repo}:cpu")["Id"] == old, "tag moved to a half build"
    again, out = build_json(root, "-t", "cpu", "--no-smoke")
    assert again.returncode == 0, again.stderr[-2000:]
    # Everything below the interrupted step came from cache: the steps before it, FROMs aside.
    lines = (root / "images/cpu/Dockerfile").read_text().split("--no-build-isolation")[0].splitlines()
    earlier = [ln for ln in lines if re.match(r"(ENV|RUN|COPY|WORKDIR|LABEL|USER|ARG) ", ln)][:-1]
    assert out["cpu"]["cached_steps"] == len(earlier), (out["cpu"], earlier)


def _registry_of(root) -> str:
    import yaml

    return yaml.safe_load((root / "matrix.yaml").read_text())["registry"]
