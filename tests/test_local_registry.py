"""The builder's loopback registry (builder.oci.localregistry) with real ``docker-registry`` processes on
free loopback ports, each test in a state folder of its own (XDG_CACHE_HOME): its login, what answers
on its port, an earlier builder's registry without a login, and ``builder gc`` of its blobs."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from builder.config.errors import UserError
from builder.config.project import Project, load_project
from builder.gc import stores as gc
from builder.oci import artifacts, localregistry, loopback, registry
from devtools.support import (
    edit_matrix,
    fail_or_skip,
    free_port,
    registry_login,
    start_registry,
    stop,
    wait_http,
)

REPO = Path(__file__).resolve().parent.parent
CONFIG = b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}'


@pytest.fixture(autouse=True)
def private_state(tmp_path, monkeypatch) -> Iterator[None]:
    """A state folder of the test's own; every registry the builder started from it is stopped after."""
    if shutil.which("docker-registry") is None:
        fail_or_skip("docker-registry is not installed (make host installs it)")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("BUILDER_WHEELHOUSE", str(tmp_path / "house"))
    monkeypatch.setattr(localregistry, "_CHECKED", set())
    yield
    for folder in (tmp_path / "cache" / "ml-image-builder").glob("registry-*"):
        if (pid := localregistry.running(folder)) is not None:
            os.kill(pid, signal.SIGKILL)


def _upload(host: str, creds: dict[str, str] | None) -> int:
    """A blob upload's first request (POST /v2/<name>/blobs/uploads/): its HTTP status."""
    request = urllib.request.Request(f"http://{host}/v2/ml-runtime/blobs/uploads/", method="POST")
    if creds:
        token = base64.b64encode(f"{creds['username']}:{creds['password']}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_builders_registry_refuses_an_anonymous_push_and_takes_its_own_login():
    """On main the registry took any blob upload (202): anyone on the host could push under our names."""
    host = f"localhost:{free_port()}"
    said = localregistry.ensure_local(host)
    folder = loopback.folder(host)
    assert said is not None and said.startswith(f"started a local registry on {host}") and "password in" in said
    assert _upload(host, None) == 401
    own = registry.credentials(host)
    assert own is not None and own["username"] == loopback.USER
    assert _upload(host, own) == 202
    digest = artifacts.push_blob(f"{host}/ml-runtime", b"ours", own)  # the builder's own client pushes
    assert artifacts.get_blob(f"{host}/ml-runtime", digest, own) == b"ours"
    assert own["password"] not in said
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for name in ("password", "htpasswd", "config.yml"):
        assert stat.S_IMODE((folder / name).stat().st_mode) == 0o600, name
    assert localregistry.ensure_local(host) is None  # answering, and ours: nothing to say
    assert registry.credentials(host) == own  # one login per user and port, kept


def test_a_registry_another_process_holds_on_the_port_is_refused(tmp_path):
    """Whatever answers on the port is not trusted for answering: a registry without a login (on main:
    used as it was), and one that refuses the builder's login (another user's), are each one line."""
    host, proc = start_registry(tmp_path / "anonymous")
    try:
        with pytest.raises(UserError, match=rf"another process holds {host}: the registry there answers without a "
                                            r"login.*choose another port in matrix.yaml \(registry: "):
            localregistry.ensure_local(host)
    finally:
        stop(proc)
    user, password, htpasswd = registry_login(tmp_path / "theirs")
    host, proc = start_registry(tmp_path / "theirs", htpasswd)
    try:
        assert registry.accepts(host, {"username": user, "password": password})
        with pytest.raises(UserError, match=rf"registry {host} takes no request without a login, and the builder "
                                            r"holds none for it: .* else another process holds the port"):
            localregistry.ensure_local(host)
        assert registry.credentials(host) is None  # nothing of theirs was taken for ours
        loopback.make_login(loopback.folder(host))  # a login of the builder's own for that port: refused there
        with pytest.raises(UserError, match=rf"another process holds {host}: the registry there refuses the "
                                            r"builder's login \(its own, "):
            localregistry.ensure_local(host)
    finally:
        stop(proc)


def test_an_earlier_builders_registry_without_a_login_is_restarted_with_one():
    """An earlier builder's registry folder and daemon (no auth): stopped, started again with a login,
    its data kept."""
    host = f"localhost:{free_port()}"
    folder = loopback.private_folder(loopback.folder(host))
    config = folder / "config.yml"
    config.write_text(f"version: 0.1\nlog: {{level: warn}}\nstorage:\n  filesystem: {{rootdirectory: "
                      f"{folder / 'data'}}}\n  delete: {{enabled: true}}\nhttp: {{addr: '127.0.0.1:{loopback.port(host)}'}}\n")
    binary = shutil.which("docker-registry")
    assert binary is not None
    with open(folder / "registry.log", "ab") as log:
        old = subprocess.Popen([binary, "serve", str(config)], stdout=log, stderr=log, start_new_session=True)
    (folder / "registry.pid").write_text(str(old.pid))
    try:
        wait_http(f"http://{host}/v2/")
        kept = artifacts.push_blob(f"{host}/ml-runtime", b"pushed before", None)  # anyone could
        said = localregistry.ensure_local(host)
        assert said is not None and f"stopped the local registry on {host} (pid {old.pid})" in said
        assert old.wait(timeout=5) is not None
        assert _upload(host, None) == 401
        assert artifacts.get_blob(f"{host}/ml-runtime", kept, registry.credentials(host)) == b"pushed before"
    finally:
        old.kill()
        old.wait()


def _image(host: str, creds: dict[str, str] | None) -> tuple[str, str, str]:
    """(config, layer, orphan): an image's two blobs under a tag, and a blob no manifest references."""
    name = f"{host}/ml-runtime"
    config, layer = artifacts.push_blob(name, CONFIG, creds), artifacts.push_blob(name, b"layer" * 100, creds)
    manifest: dict[str, Any] = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config,
                           "size": len(CONFIG)},
                "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer, "size": 500}]}
    artifacts.put_manifest(name, "keep", json.dumps(manifest).encode(), manifest["mediaType"], creds)
    return config, layer, artifacts.push_blob(name, b"orphan" * 1000, creds)


def _blob(folder: Path, digest: str) -> Path:
    return folder / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256" / digest[7:9] / digest[7:] / "data"


def _registry_project(project: Path) -> tuple[str, Project]:
    host = f"localhost:{free_port()}"
    edit_matrix(project, registry=f"{host}/ml-runtime")
    return host, load_project(project / "matrix.yaml", allow_unpinned=True)


def test_gc_collects_an_unreferenced_blob_and_starts_the_registry_again(project):
    """gc --dry-run lists the orphan blob alone, gc removes it alone, with the registry stopped meanwhile
    and running again after (as it was)."""
    host, p = _registry_project(project)
    localregistry.ensure_local(host)
    folder = localregistry.own_folder(p.matrix.registry)
    assert folder is not None
    config, layer, orphan = _image(host, registry.credentials(host) or {})
    before = localregistry.running(folder)
    found = gc.collect(None, p, keep_days=7)
    assert [(i.name, i.bytes) for i in found.items if i.store == "registry"] == [(orphan, 6000)]
    assert _blob(folder, orphan).exists()  # the dry run removed nothing
    assert gc.remove(None, p, found) == []
    assert not _blob(folder, orphan).exists()
    assert _blob(folder, config).exists() and _blob(folder, layer).exists()
    after = localregistry.running(folder)
    assert after is not None and after != before and registry.ping(host)  # it ran, so it runs again
    assert _upload(host, None) == 401  # with its login
    assert gc.collect(None, p).items == []


IGNORES_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); " \
                  "time.sleep(120)"


def test_gc_leaves_the_blobs_of_a_registry_that_does_not_stop(project, monkeypatch):
    """The PID file names a process serving the registry's config that ignores SIGTERM: gc says so in one
    line and leaves every blob (on main it ran garbage-collect under the live registry anyway)."""
    host, p = _registry_project(project)
    localregistry.ensure_local(host)
    folder = localregistry.own_folder(p.matrix.registry)
    assert folder is not None
    _, _, orphan = _image(host, registry.credentials(host) or {})
    real = localregistry.running(folder)
    assert real is not None
    os.kill(real, signal.SIGTERM)
    stubborn = subprocess.Popen([sys.executable, "-c", IGNORES_SIGTERM, "serve", str(folder / "config.yml")],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline().strip() == "ready"
        (folder / "registry.pid").write_text(str(stubborn.pid))
        assert localregistry.running(folder) == stubborn.pid
        monkeypatch.setattr(localregistry, "STOP_S", 1.0)
        found = gc.collect(None, p, keep_days=7)
        said: list[str] = []
        failed = gc.remove(None, p, found, say=said.append)
        assert [i.name for i in failed] == [orphan]
        assert said == [(f"registry: 1 unreferenced blobs left in {folder / 'data'}: the registry (pid "
                        f"{stubborn.pid}) did not stop within 1 s, and garbage-collect needs it stopped")]
        assert _blob(folder, orphan).exists()
        assert stubborn.poll() is None  # still running: nothing was started beside it
    finally:
        stubborn.kill()
        stubborn.wait()


HOLDS = ("import sys, time; from builder.oci.localregistry import ensure_local; ensure_local(sys.argv[1]); "
         "print('holding', flush=True); time.sleep(120)")


def test_gc_never_stops_the_registry_under_another_runs_build(project):
    """Another run (a build with --push) holds the registry: gc leaves it running and its blobs in place,
    in one line; once that run is gone, gc collects (on main: stopped under the build)."""
    host, p = _registry_project(project)
    localregistry.ensure_local(host)
    folder = localregistry.own_folder(p.matrix.registry)
    assert folder is not None
    _, _, orphan = _image(host, registry.credentials(host) or {})
    pid = localregistry.running(folder)
    build = subprocess.Popen([sys.executable, "-c", HOLDS, host], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert build.stdout is not None and build.stdout.readline().strip() == "holding"
        said: list[str] = []
        failed = gc.remove(None, p, gc.collect(None, p, keep_days=7), say=said.append)
        assert [i.name for i in failed] == [orphan]
        assert said == [(f"registry: 1 unreferenced blobs left in {folder / 'data'}: another build holds the "
                        "registry (it pushes there): run builder gc when it is done")]
        assert localregistry.running(folder) == pid and _blob(folder, orphan).exists()
    finally:
        build.kill()
        build.wait()
    assert gc.remove(None, p, gc.collect(None, p, keep_days=7)) == []
    assert not _blob(folder, orphan).exists()


def test_a_build_reads_no_cache_from_a_loopback_registry_anyone_can_push_to(tmp_path):
    """A registry without a login holds a cache manifest under the name a build reads its cache from: the
    build reads nothing from it and says who holds the port (on main BuildKit was handed it: a cache anyone
    on the host could have written, whose layers end up in the image)."""
    from builder.images import lookup

    host, proc = start_registry(tmp_path / "anonymous")
    try:
        _image(host, None)  # anyone can push there
        with pytest.raises(UserError, match=rf"another process holds {host}: the registry there answers without"):
            lookup.registry_cache_source(f"{host}/ml-runtime:keep")
    finally:
        stop(proc)


def test_doctor_says_who_holds_the_registrys_port(project, tmp_path):
    """`builder doctor`: a loopback registry anyone can push to fails its registry check, with the fix; the
    builder's own passes (on main both were "answers /v2/")."""
    from builder.host import doctor, hardware

    host, proc = start_registry(tmp_path / "anonymous")
    try:
        edit_matrix(project, registry=f"{host}/ml-runtime")
        ctx = doctor.Context(hardware.HostGpus(), project / "matrix.yaml",
                             project=load_project(project / "matrix.yaml", allow_unpinned=True))
        (check,) = doctor.check_registry(ctx)
    finally:
        stop(proc)
    assert check.status == "fail"
    assert check.found == f"another process holds {host}: the registry there answers without a login, so anyone " \
                          "on this host can push under your image names"
    assert check.fix is not None and check.fix.startswith("stop it, or choose another port in matrix.yaml")
    own, p = _registry_project(project)
    localregistry.ensure_local(own)
    ctx = doctor.Context(hardware.HostGpus(), project / "matrix.yaml", project=p)
    assert [c.status for c in doctor.check_registry(ctx)] == ["ok"]
