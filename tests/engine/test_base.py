"""The shared base: reproducible bootstrap (two real mmdebstrap runs), load, push, pin."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import run_builder

from devtools.support import base_pin, copy_project, edit_matrix, host_platform, native_only

pytestmark = [pytest.mark.engine, pytest.mark.classic]


def test_builder_base_twice_gives_the_same_image_id(tmp_path, engine, registry, based_project):
    """Two bootstraps in this run (the fixture's, then one more with the lock deleted) load as the
    same image ID and the same registry digest."""
    root = copy_project(tmp_path / "p")
    edit_matrix(root, registry=f"{registry}/ml-runtime")
    native_only(root)
    lock1 = base_pin(based_project)
    (root / "base.lock.json").unlink()
    second = run_builder("base", cwd=root)  # bootstraps afresh: no lock
    assert second.returncode == 0, second.stderr
    lock2 = base_pin(root)
    assert lock1["image_id"] == lock2["image_id"]
    assert lock1["reference"] == lock2["reference"]
    assert lock1["reference"].startswith(f"{registry}/ml-runtime/base@sha256:")
    info = engine.client.api.inspect_image(lock1["reference"])  # the engine's own ID differs by image store
    assert info["Created"].startswith("2025-01-01T00:00:00"), "created must be SOURCE_DATE_EPOCH, not now"
    # The pin lives in base.lock.json alone: the rendered Dockerfiles name none, and stay current.
    assert "base@sha256:" not in (root / "images/cpu/Dockerfile").read_text()
    assert run_builder("render", "--check", cwd=root).returncode == 0
    # Third run: the lock matches and the image is local: nothing is bootstrapped.
    third = run_builder("base", cwd=root)
    assert third.returncode == 0 and "pinned" not in third.stdout


def test_base_check_reports_drift_with_packages(tmp_path):
    """--check bootstraps afresh; a lock from another mirror state is reported package by package."""
    root = copy_project(tmp_path / "p")
    lock = json.loads((root / "base.lock.json").read_text())
    pinned = lock["platforms"][host_platform()]
    pinned["image_id"] = "sha256:" + "0" * 64
    pinned["packages"]["bash"] = "0.0-old"
    (root / "base.lock.json").write_text(json.dumps(lock))
    proc = run_builder("base", "--check", "--platform", host_platform(), cwd=root)
    assert proc.returncode == 1, proc.stderr
    assert "base drift" in proc.stdout and "bash: 0.0-old ->" in proc.stdout
    assert "builder base --update" in proc.stdout


def test_base_update_after_a_registry_change_re_pins_the_same_base(tmp_path, registry, based_project):
    """The fix the error message names works from that state: the same base, pushed to the new registry."""
    root = copy_project(tmp_path / "p")
    shutil.copy(based_project / "base.lock.json", root / "base.lock.json")
    native_only(root)
    edit_matrix(root, registry=f"{registry}/moved")
    refused = run_builder("build", "-t", "cpu", "--no-smoke", cwd=root)
    assert refused.returncode == 2 and "builder base --update" in refused.stderr, refused.stderr
    moved = run_builder("base", "--update", cwd=root)
    assert moved.returncode == 0, moved.stderr + moved.stdout
    old, new = base_pin(based_project), base_pin(root)
    assert new["reference"].startswith(f"{registry}/moved/base@sha256:")
    assert new["image_id"] == old["image_id"] and "bootstrapping" not in moved.stdout, moved.stdout


def test_a_load_the_engine_refuses_is_one_line_naming_it(engine, tmp_path):
    """The base's docker-archive, cut short: the engine's refusal is read out of the load (docker-py
    hands it back as a generator) and becomes one line naming what was loaded; nothing is tagged."""
    from builder.base.blobs import load_archive
    from builder.base.bootstrap import Rootfs, write_archive
    from builder.config.errors import UserError

    layer = tmp_path / "layer.tar"
    import hashlib
    import io
    import tarfile

    with tarfile.open(layer, "w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = 6
        tar.addfile(info, io.BytesIO(b"hello\n"))
    diff_id = "sha256:" + hashlib.sha256(layer.read_bytes()).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    ref = f"ml-builder-test/cut-short:{tmp_path.name[-12:].lower()}"
    archive = tmp_path / "image.tar"
    write_archive(Rootfs(layer, diff_id, {}), config, ref, archive)
    data = archive.read_bytes()
    archive.write_bytes(data[: len(data) // 3])  # a truncated download, a full disk
    with pytest.raises(UserError) as caught:
        load_archive(engine, archive, "the linux/amd64 base")
    assert str(caught.value).startswith("the engine could not load the linux/amd64 base: ")
    assert len(str(caught.value).splitlines()) == 1
    assert not engine.client.images.list(name=ref.split(":")[0])


def test_the_base_pin_follows_the_content_not_what_the_engine_holds(tmp_path, engine, based_project):
    """The same base bootstrapped and pushed by an engine that holds its layer otherwise, an empty one of
    the other image store (the containerd store pushed the loaded layer uncompressed, the classic store
    gzipped it anew, each into another manifest), into a fresh registry (the registry data is gone):
    the same manifest digest as the session's first pin. Both pins are made here (the Debian mirror
    moves: no committed digest is compared); the same image ID shows the mirror held still."""
    from devtools.dockerd import DockerdUnavailable, extra_dockerd
    from devtools.support import docker_login, fail_or_skip, registry_login, start_registry, stop

    first = base_pin(based_project)
    other = "classic" if engine.store() == "containerd" else "containerd"
    user, password, htpasswd = registry_login(tmp_path / "fresh-registry")
    fresh, proc = start_registry(tmp_path / "fresh-registry", htpasswd)
    docker_login(Path(os.environ["DOCKER_CONFIG"]), fresh, user, password)  # the session's Docker config
    try:
        with extra_dockerd(tmp_path / "engine", "pb", store=other) as host:
            root = copy_project(tmp_path / "p")
            edit_matrix(root, registry=f"{fresh}/ml-runtime")
            native_only(root)
            (root / "base.lock.json").unlink()
            made = run_builder("base", cwd=root, env={"DOCKER_HOST": host})
            assert made.returncode == 0, made.stderr + made.stdout
    except DockerdUnavailable as exc:
        fail_or_skip(str(exc))
    finally:
        stop(proc)
    second = base_pin(root)
    assert second["image_id"] == first["image_id"], "the mirror moved between the two bootstraps: rerun"
    assert second["reference"].split("@")[1] == first["reference"].split("@")[1], made.stdout
