"""Real builds on the real engine: the cpu image end to end, cache, faults, interruption."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from doubles import Silent
from helpers import bare_build_project, fake_view, publish_base_to, run_builder

from builder.images.smoke import SMOKE_LABEL
from builder.oci.docker import image_store
from devtools.support import base_pin, copy_project, edit_matrix, free_port, layer_tar, registry_of

pytestmark = pytest.mark.engine


def build_json(root, *args: str, env=None):
    proc = run_builder("build", "--json", "-q", *args, cwd=root, env=env)
    try:
        return proc, {o["target"]: o for o in json.loads(proc.stdout)}
    except json.JSONDecodeError:
        pytest.fail(f"no JSON from builder build (exit {proc.returncode}): {proc.stderr[-2000:]}")


@pytest.mark.classic
def test_cpu_image_builds_and_passes_smoke(cpu_project, engine):
    """The fixture built, smoke-tested and pushed cpu; the record says so, with its content tag."""
    record = json.loads((cpu_project / "dist" / "published.json").read_text())["cpu"]
    assert record["result"] == "built" and record["content_tag"].startswith(f"{registry_of(cpu_project)}:cpu-")
    info = engine.client.api.inspect_image(record["content_tag"])
    assert record["image_id"] == info["Id"]
    config = info["Config"]
    assert config["User"] == "1001:1001" and config["WorkingDir"] == "/workspace"
    assert config["Entrypoint"] == ["/usr/bin/tini", "--", "runtime-check", "exec", "--"]
    labels = config["Labels"]
    assert labels["io.ml-image-builder.torch"] == "2.13.0+cpu"
    assert labels["org.opencontainers.image.revision"] == record["revision"]
    assert len(labels["org.opencontainers.image.revision"]) >= 7
    assert labels["org.opencontainers.image.created"]
    repo = registry_of(cpu_project)
    assert {f"{repo}:{t}" for t in ("cpu", "cpu-torch2.13.0", "latest-cpu")} <= set(info["RepoTags"])


@pytest.mark.classic
def test_unchanged_target_is_reused_not_rebuilt(cpu_project, engine):
    proc, out = build_json(cpu_project, "-t", "cpu")
    assert proc.returncode == 0, proc.stderr[-2000:]
    cpu = out["cpu"]
    assert cpu["result"] == "reused-local" and cpu["error"] is None
    assert cpu["steps"] == 0 and cpu["smoke"] == "passed earlier"  # no build, no smoke
    assert set(cpu["tags"]) == {"cpu", "cpu-torch2.13.0", "latest-cpu"}
    assert engine.client.api.inspect_image(cpu["content_tag"])["Id"] == cpu["image_id"]
    printed = json.loads(run_builder("print", "-t", "cpu", cwd=cpu_project).stdout)
    assert printed["targets"][0]["content_tags"][cpu["platform"]] == cpu["content_tag"]  # shown without building


def test_content_tag_follows_what_goes_into_the_image(tmp_path):
    root = copy_project(tmp_path / "p")  # the repository's own matrix and base pin

    def tag() -> str:
        printed = json.loads(run_builder("print", "-t", "cpu", cwd=root).stdout)["targets"][0]
        return printed["content_tags"]["linux/amd64"]  # the repository's cpu target: linux/amd64 only

    first = tag()
    (root / "README.md").write_text("not in the build context\n")
    assert tag() == first
    with (root / "runtime/ml_runtime/__init__.py").open("a") as handle:
        handle.write("\n# a change the image carries\n")
    assert tag() != first


def test_rebuild_really_builds(cpu_project, engine):
    """Every step runs again. Where the image store keeps layers compressed (containerd), the wheel
    layers are exported early, beside the build, and those buildx builds are gone when the
    build ends; that it changes no byte of the image is test_verify_rebuild's (an image built this
    way, rebuilt on a classic store, where nothing is exported early, is the same bit for bit)."""
    proc, out = build_json(cpu_project, "-t", "cpu", "--rebuild")
    assert proc.returncode == 0, proc.stderr[-2000:]
    cpu = out["cpu"]
    assert cpu["result"] == "built" and cpu["smoke"] == "passed"
    assert cpu["steps"] > 0 and cpu["cached_steps"] == 0  # no layer cache either
    assert ("export: early" in cpu["phases"]) == (image_store(engine.client.info()) == "containerd"), cpu["phases"]
    assert not _early_exports(cpu_project), "an early export is still running"


def _early_exports(root: Path) -> list[int]:
    """The running ``buildx build --target wheel-layer-*`` processes started in *root*."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if (b"buildx" in argv and any(a.startswith(b"wheel-layer-") for a in argv)
                    and Path(os.readlink(proc / "cwd")) == root.resolve()):
                found.append(int(proc.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def test_tools_stage_refuses_a_uv_wheel_that_is_not_the_locked_one(cpu_project, engine):
    """The tools stage takes uv's binary out of its wheel itself (no pip): a wheel whose sha256 is not the
    locked one stops the build there. The staged uv wheel is real; the lock given for it is not."""
    bake = json.loads(run_builder("bake", "-t", "cpu", "--print", cwd=cpu_project).stdout)["target"]["cpu"]
    args = dict(bake["args"])
    args["WHEELS_TOOLS"] = re.sub(r"sha256:[0-9a-f]{64}", "sha256:" + "0" * 64, args["WHEELS_TOOLS"])
    argv = ["docker", "buildx", "build", "--target", "tools", "--output", "type=cacheonly", "--progress", "plain",
            "--file", bake["dockerfile"], *[f"--build-arg={k}={v}" for k, v in args.items()],
            f"--build-context=wheels-tools={bake['contexts']['wheels-tools']}", "."]
    proc = subprocess.run(argv, cwd=cpu_project, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode != 0, proc.stderr[-2000:]
    assert re.search(r"uv-[^ ]+\.whl: FAILED", proc.stderr), proc.stderr[-2000:]


@pytest.mark.classic
def test_no_wheel_cache_or_credential_in_any_layer(cpu_project, engine, tmp_path):
    """docker save the image and read every layer above the base: no .whl, no pip/uv cache,
    no pip config or netrc. (The base is Debian's own packages: its python3-venv ships the
    ensurepip wheels under /usr/share/python-wheels, which are not ours.)"""
    repo = f"{registry_of(cpu_project)}:cpu"
    base = base_pin(cpu_project)["reference"]
    skip = len(engine.client.api.inspect_image(base)["RootFS"]["Layers"])
    archive = tmp_path / "image.tar"
    with archive.open("wb") as handle:
        for chunk in engine.client.api.get_image(repo):
            handle.write(chunk)
    bad, scanned = [], 0
    with tarfile.open(archive) as outer:
        manifest_file = outer.extractfile("manifest.json")
        assert manifest_file is not None, "a docker-archive has a manifest.json"
        manifest = json.load(manifest_file)
        for layer_name in manifest[0]["Layers"][skip:]:
            scanned += 1
            layer_file = outer.extractfile(layer_name)
            assert layer_file is not None, f"the manifest's layer {layer_name} is in the archive"
            blob = layer_file.read()
            with tarfile.open(fileobj=io.BytesIO(layer_tar(blob))) as layer:
                for name in layer.getnames():
                    if (name.endswith((".whl", ".netrc")) or "/.cache/pip" in name or "/.cache/uv" in name
                            or name.startswith("tmp/uv/") or "pip.conf" in name):
                        bad.append(name)
    assert scanned >= 4, "expected the common, torch and runtime layers"
    assert not bad, bad[:10]


def test_unreachable_index_fails_cleanly_while_others_build(cpu_project):
    # A loopback port nobody listens on: unreachable on every network, not only on one that
    # happens to block download.pytorch.org.
    index = f"http://127.0.0.1:{free_port()}/whl/rocm5.7"
    proc, out = build_json(cpu_project, "-t", "cpu", "-t", "amd-rocm5.7", "--keep-going", "--no-smoke",
                           env={"BUILDER_INDEX_ROCM5_7": index})
    assert proc.returncode == 1
    assert out["cpu"]["error"] is None and out["cpu"]["image_id"]
    err = out["amd-rocm5.7"]["error"]
    assert index in err and "unreachable" in err and "refused" in err.lower()
    assert "BUILDER_INDEX_ROCM5_7=URL" in err and "--index rocm5.7=URL" in err
    assert "Traceback" not in proc.stderr


def test_no_engine_is_one_line_exit_2(project):
    proc = run_builder("build", "-t", "cpu", cwd=project, env={"DOCKER_HOST": "unix:///tmp/no-such-docker.sock"})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "DOCKER_HOST" in lines[0] and "unix:///tmp/no-such-docker.sock" in lines[0]


@pytest.mark.classic
def test_ctrl_c_mid_build_leaves_nothing_and_resumes(cpu_project, engine, tmp_path):
    """SIGINT during a RUN step: exit 130, no container left, the old tag kept, next run resumes."""
    root = copy_project(tmp_path / "p")
    repo = registry_of(cpu_project) + "-interrupt"  # its own tags: other tests keep theirs
    edit_matrix(root, registry=repo)
    publish_base_to(engine, cpu_project, root, repo)  # same layers, same digest: the lock holds
    try:
        _interrupt_and_resume(root, repo, engine)
    finally:
        for image in engine.client.images.list(name=repo):
            for tag in image.tags:  # the same image may carry other tests' tags: only ours go
                if tag.startswith(repo + ":"):
                    engine.client.api.remove_image(tag, noprune=True)


def _interrupt_and_resume(root, repo, engine):
    first, _ = build_json(root, "-t", "cpu", "--no-smoke")
    assert first.returncode == 0, first.stderr[-2000:]
    old = engine.client.api.inspect_image(f"{repo}:cpu")["Id"]
    with (root / "runtime/ml_runtime/__init__.py").open("a") as handle:
        handle.write(f"\n# cache buster {time.time()}\n")
    before = {c.id for c in engine.client.containers.list(all=True)}
    proc = subprocess.Popen([sys.executable, "-m", "builder", "build", "-t", "cpu", "--no-smoke"], cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=os.environ.copy())
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "--no-build-isolation" in line:  # the runtime's RUN step has started (its step line)
            time.sleep(1.0)
            proc.send_signal(signal.SIGINT)
            break
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(seen[-20:]) + rest
    assert "Traceback" not in rest
    # At once: buildx was cancelled and waited for; nothing of the build runs or stays.
    left = {c.id for c in engine.client.containers.list(all=True)} - before
    assert not left, f"{len(left)} containers left after Ctrl-C"
    assert not _buildx_running(root), "a buildx process of the interrupted build is still running"
    assert engine.client.api.inspect_image(f"{repo}:cpu")["Id"] == old, "tag moved to a half build"
    again, out = build_json(root, "-t", "cpu", "--no-smoke")
    assert again.returncode == 0, again.stderr[-2000:]
    # Everything below the interrupted step came from cache: BuildKit's steps before it (RUN, COPY,
    # WORKDIR; FROM, ARG, ENV and LABEL make no step).
    text = (root / "images/cpu/Dockerfile").read_text().split("--no-build-isolation")[0]
    earlier = [ln for ln in text.splitlines() if re.match(r"(RUN|COPY|ADD|WORKDIR) ", ln)][:-1]
    assert out["cpu"]["cached_steps"] == len(earlier), (out["cpu"], earlier)


def _buildx_running(root) -> bool:
    """A ``docker buildx build`` process whose working directory is *root*."""
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            if b"buildx" in cmdline and b"build" in cmdline and os.readlink(proc / "cwd") == str(root):
                return True
        except OSError:
            continue
    return False


# Interrupts and smoke timeouts on a 2 MB image (FROM scratch + static busybox): seconds, not minutes.

TEST_LABEL = "io.ml-image-builder.test"


@pytest.fixture
def busybox(engine, tmp_path):
    """A tiny image with a shell, tagged (BuildKit starts FROM a name); every image and container
    descending from it goes at the end."""
    binary = next((p for p in ("/bin/busybox", "/usr/bin/busybox") if os.path.isfile(p)), None)
    if binary is None:
        pytest.fail("no static busybox (apt-get install busybox-static)")
    context = tmp_path / "busybox"
    context.mkdir()
    shutil.copy(binary, context / "busybox")
    (context / "Dockerfile").write_text(
        'FROM scratch\nCOPY busybox /bin/busybox\nRUN ["/bin/busybox", "--install", "-s", "/bin"]\n')
    marker = uuid.uuid4().hex[:12]
    tag = f"mlb-test-busybox:{marker}"
    build = subprocess.run(["docker", "buildx", "build", "-q", "--provenance=false", "--label", f"{TEST_LABEL}={marker}",
                            "-t", tag, str(context)], capture_output=True, text=True, check=False)
    assert build.returncode == 0, build.stderr
    try:
        yield tag
    finally:  # labels are inherited: this finds every image built on it, children first
        for container in engine.client.containers.list(all=True, filters={"ancestor": tag}):
            container.remove(force=True)
        for built in sorted(engine.client.images.list(all=True, filters={"label": f"{TEST_LABEL}={marker}"}),
                            key=lambda i: i.attrs["Created"], reverse=True):
            engine.client.images.remove(built.id, force=True, noprune=True)


class _UI(Silent):
    """Progress stand-in that SIGINTs the main thread once *want* targets are in their sleep step."""

    def __init__(self, want: int, on_running: Callable[[], None]) -> None:
        self.want, self.on_running, self.armed = want, on_running, True
        self.sleeping: set[str] = set()
        main = threading.main_thread().ident
        assert main is not None  # the main thread has started
        self.main = main

    def step(self, target: str, n: int, total: int, text: str) -> None:
        if "sleep" in text and target not in self.sleeping:
            self.sleeping.add(target)
            if len(self.sleeping) == self.want:
                self.on_running()
                threading.Timer(1.0, self.interrupt).start()

    def interrupt(self) -> None:
        if self.armed:  # never after build_all returned: pytest itself would get it
            signal.pthread_kill(self.main, signal.SIGINT)


def _interrupted_build(engine, busybox, tmp_path, monkeypatch, jobs: int, decoys: list[str]) -> float:
    """build_all over fake target views whose Dockerfiles sleep, SIGINT once they all sleep; return its seconds.

    Adds to *decoys* containers that the build must not touch."""
    from builder.images import build

    names = [f"t{i}" for i in range(max(jobs, 1))]
    for i, name in enumerate(names):
        (tmp_path / name).mkdir()
        (tmp_path / name / "Dockerfile").write_text(  # a step of its own: never in BuildKit's cache
            f"FROM {busybox} AS common\nRUN echo common\nFROM common\nRUN echo {uuid.uuid4().hex} && sleep 30{i}\n")
    project = bare_build_project(monkeypatch, tmp_path)
    views = [fake_view(n, dockerfile=f"{n}/Dockerfile", primary_ref="127.0.0.1:1/none:x") for n in names]

    def add_decoys() -> None:
        # New since the build began, yet not its own: a plain container, another process's smoke container.
        decoys.append(engine.client.api.create_container(busybox, ["/bin/sh", "-c", "sleep 300"])["Id"])
        decoys.append(engine.client.containers.create(busybox, ["sleep", "1"], labels={SMOKE_LABEL: "1"}).id)

    ui = _UI(len(names), add_decoys)
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            build.build_all(engine, project, views, ui, smoke=False, jobs=jobs)
    finally:
        ui.armed = False
    return time.monotonic() - start


@pytest.mark.parametrize("jobs", [1, 2])
def test_interrupt_leaves_no_container_of_its_own_and_only_those(engine, busybox, tmp_path, monkeypatch, jobs):
    """Checked the moment build_all gives the interrupt back: nothing of the build is left."""
    decoys: list[str] = []
    try:
        elapsed = _interrupted_build(engine, busybox, tmp_path, monkeypatch, jobs, decoys)
        left = {c.id for c in engine.client.containers.list(all=True, filters={"ancestor": busybox})}
        assert len(decoys) == 2 and left == set(decoys), "the build's containers must go, others' stay"
        assert not _buildx_running(tmp_path), "the cancelled builds' buildx processes must be gone"
        assert elapsed < 30, "an interrupt must not wait for the builds to finish"
    finally:
        for cid in decoys:
            engine.client.api.remove_container(cid, force=True)


def test_smoke_container_past_its_timeout_fails_the_target(engine, busybox):
    from builder.config.errors import TargetFailed
    from builder.images.smoke import run_container

    with pytest.raises(TargetFailed, match=r"still running after the 2 s timeout.*docker run --rm -it"):
        run_container(engine, busybox, ["sleep", "60"], timeout=2)
    assert not engine.client.containers.list(all=True, filters={"ancestor": busybox}), "the container must go"
