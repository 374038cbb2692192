"""``builder gc``'s selection, without an engine: which wheels, staged folders, BuildKit records and
recorded images go (builder.images.owned decides from records and docker's listings, here written
out); and the loopback registry's unreferenced blobs with a real docker-registry."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from builder.config.ownership import Record, run_token
from builder.config.project import load_project
from builder.images import gc, owned, wheelhouse
from devtools.support import edit_matrix, free_port

DAY = 86400


def _old(path: Path, days: float) -> Path:
    t = time.time() - days * DAY
    os.utime(path, (t, t))
    return path


def test_select_files_keeps_referenced_young_and_linked(tmp_path):
    house = tmp_path / "house"
    (house / ".contexts").mkdir(parents=True)
    wanted, stale, young, linked = (house / f"{n}-1.0-py3-none-any.whl" for n in "abcd")
    for p in (wanted, stale, young, linked):
        p.write_bytes(b"x" * 100)
    for p in (wanted, stale, linked):
        _old(p, 30)
    current = house / ".contexts" / ("1" * 32)
    (current / "pkg").mkdir(parents=True)
    other_clone = house / ".contexts" / ("2" * 32)  # not ours, but used by a build today
    (other_clone / "pkg").mkdir(parents=True)
    os.link(linked, other_clone / "pkg" / linked.name)
    old_folder = _old(_mk(house / ".contexts" / ("3" * 32)), 30)
    (house / ".verified.json").write_text("{}")
    folders, wheels = gc.select_files(house, {wanted.name}, {current.name}, keep_days=7)
    assert folders == [old_folder]
    assert wheels == [stale]
    # --keep-days 0: only this checkout counts, the other clone's folder and the young wheel go too.
    folders, wheels = gc.select_files(house, {wanted.name}, {current.name}, keep_days=0)
    assert set(folders) == {other_clone, old_folder}
    assert set(wheels) == {stale, young, linked}


def test_freed_bytes_counts_an_inode_once_and_only_with_all_its_links(tmp_path):
    a = tmp_path / "a"
    a.write_bytes(b"x" * 1000)
    (tmp_path / "f").mkdir()
    os.link(a, tmp_path / "f" / "a")
    (tmp_path / "f" / "own").write_bytes(b"y" * 10)
    assert gc.freed_bytes([a]) == 0  # a link in f keeps the data
    assert gc.freed_bytes([tmp_path / "f"]) == 10
    assert gc.freed_bytes([a, tmp_path / "f"]) == 1010


def _cache(i: str, in_use: bool = False, desc: str = "local source for wheels-torch",
           kind: str = "source.local") -> dict[str, Any]:
    return {"ID": i, "Type": kind, "Description": desc, "LastUsedAt": "2026-01-01T00:00:00Z", "InUse": in_use,
            "Size": 1}


def test_a_wheel_context_copy_goes_only_when_ours_superseded_here_and_no_other_clone_uses_it():
    """Superseded by the ledger's times of use (one build's copies share one: BuildKit keeps two of each
    context name per clone), never by BuildKit's LastUsedAt."""
    now = time.time()
    last, before = now - DAY, now - 2 * DAY
    records = {"a": Record(clones={"/a": last}), "a2": Record(clones={"/a": last}),  # this clone's last build: both
               "b": Record(clones={"/a": before}),                                # ours, superseded: goes
               "d": Record(clones={"/a": before}),                                # in use: never
               "e": Record(clones={"/a": before, "/b": now}),                     # clone /b used it today
               "f": Record(clones={"/a": before})}                                # the only one of its name
    cache = [_cache("a"), _cache("a2"), _cache("b"), _cache("c"), _cache("d", in_use=True), _cache("e"),
             _cache("f", desc="local source for wheels-common"), _cache("g", kind="regular")]
    assert [r["ID"] for r in owned.stale_wheel_sources(cache, records, clone="/a", keep_days=7)] == ["b"]
    assert [r["ID"] for r in owned.stale_wheel_sources(cache, records, clone="/a", keep_days=0)] == ["b", "e"]
    assert owned.stale_wheel_sources(cache, records, clone="/new", keep_days=0) == []  # it used none of them
    assert owned.stale_wheel_sources(cache, records, clone="/b", keep_days=7) == []  # /a's: used within 7 days
    assert [r["ID"] for r in owned.stale_wheel_sources(cache, records, clone="/b", keep_days=0)] == ["a", "a2", "b"]


def test_which_recorded_images_go_and_why_the_others_stay(tmp_path):
    """builder.images.owned.verdict: only recorded images, never a current one, one a live run holds or
    builds, one another clone used within --keep-days, one a container uses, one a file names by digest."""
    now = time.time()
    live = run_token()
    dead = subprocess.run([sys.executable, "-c", "from builder.config.ownership import run_token; print(run_token())"],
                          capture_output=True, text=True, check=True).stdout.strip()

    def rec(tags=("r:t0-aa",), target="t0", clones=None, runs=()):
        return Record(facts={"target": target, "tags": list(tags)}, recorded=now - 9 * DAY,
                      clones=clones or {"/a": now - 2 * DAY}, runs=list(runs))

    def img(i, tags=("r:t0-aa",), containers=0, digests=()):
        return {"Id": i, "RepoTags": list(tags), "RepoDigests": list(digests), "Containers": containers}

    digest = "sha256:" + "d" * 64
    images = [img("current", ["r:t0-current"]), img("held"), img("gone-run"), img("building"), img("other-clone"),
              img("container", containers=1), img("published", digests=[f"r@{digest}"]), img("named", ["r:t0-aa", "me:mine"]),
              img("untagged", []), img("pulled", ["r@sha256:" + "e" * 64]), img("unrecorded")]
    records = {"current": rec(["r:t0-current"]), "held": rec(runs=[live]), "gone-run": rec(runs=[dead]),
               "building": rec(target="t1"), "other-clone": rec(clones={"/a": now - 9 * DAY, "/b": now - 3 * DAY}),
               "container": rec(), "published": rec(), "named": rec(), "untagged": rec(), "pulled": rec(),
               owned.BUILDING + "t1": Record(runs=[live])}
    verdicts = {v.id: v for v in owned.image_verdicts(images, records, clone="/a", keep_days=7, current={"r:t0-current"},
                                                       references={digest: "/c/dist/published.json"})}
    assert set(verdicts) == set(records) - {"current", owned.BUILDING + "t1"}
    assert {i: v.kept for i, v in verdicts.items() if v.kept} == {
        "held": "a running build holds it", "building": "a build of t1 is running",
        "other-clone": "clone /b used it 3.0 days ago (--keep-days 7)", "container": "a container uses it",
        "published": "/c/dist/published.json names it by digest"}
    assert (verdicts["gone-run"].untag, verdicts["gone-run"].remove) == (("r:t0-aa",), True)
    assert (verdicts["named"].untag, verdicts["named"].remove) == (("r:t0-aa",), False)  # me:mine keeps the image
    assert (verdicts["untagged"].untag, verdicts["untagged"].remove) == ((), True)
    # The containerd store lists an image pulled by digest with that name among its tags: no tag.
    assert (verdicts["pulled"].untag, verdicts["pulled"].remove) == ((), True)
    again = owned.image_verdicts(images, records, clone="/a", keep_days=2, current=set(), references={})
    assert not next(v for v in again if v.id == "other-clone").kept  # /b's use is older than 2 days


def test_referenced_wheels_are_every_lock_under_images(project):
    p = load_project(project / "matrix.yaml")
    names = gc.referenced_wheels(p)
    assert any(n.startswith("torch-") and "+cpu" in n for n in names)
    assert any(n.startswith("uv-") for n in names)  # tools.lock


def test_report_lines_one_per_store_and_items_with_verbose():
    found = gc.Found(held={"wheelhouse": 5_000_000}, items=[gc.Item("wheelhouse", "b.whl", 1_500_000)])
    lines = gc.report_lines(found, verbose=False, dry_run=True)
    assert len(lines) == len(gc.STORES)
    assert lines[0] == "wheelhouse: holds 5.0 MB; would free 1.5 MB (1 items)"
    assert "  b.whl  1.5 MB" in gc.report_lines(found, verbose=True, dry_run=True)
    assert json.loads(gc.as_json(found, True))["stores"][0]["freed"] == 1_500_000


def _push_blob(host: str, repo: str, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    with urllib.request.urlopen(urllib.request.Request(f"http://{host}/v2/{repo}/blobs/uploads/", method="POST")) as r:
        location = r.headers["Location"]
    sep = "&" if "?" in location else "?"
    url = location if location.startswith("http") else f"http://{host}{location}"
    urllib.request.urlopen(urllib.request.Request(f"{url}{sep}digest={digest}", data=data, method="PUT",
                                                  headers={"Content-Type": "application/octet-stream"})).close()
    return digest


@pytest.mark.skipif(shutil.which("docker-registry") is None, reason="docker-registry is not installed")
def test_registry_unreferenced_blob_is_collected_and_the_registry_runs_again(project, tmp_path, monkeypatch):
    """A real docker-registry (builder.oci.localregistry): one image (config + layer, a manifest) and
    one blob no manifest references; gc --dry-run lists that blob alone, gc removes it alone."""
    from builder.oci.localregistry import ensure_local
    from builder.oci.registry import ping

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("BUILDER_WHEELHOUSE", str(tmp_path / "house"))
    host = f"localhost:{free_port()}"
    edit_matrix(project, registry=f"{host}/ml-runtime")
    p = load_project(project / "matrix.yaml", allow_unpinned=True)
    ensure_local(host)
    folder = gc.registry_folder(p)
    assert folder is not None
    try:
        config = _push_blob(host, "ml-runtime", b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}')
        layer = _push_blob(host, "ml-runtime", b"layer" * 100)
        manifest: dict[str, Any] = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config,
                               "size": 78},
                    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer, "size": 500}]}
        manifest["config"]["size"] = len(b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}')
        urllib.request.urlopen(urllib.request.Request(
            f"http://{host}/v2/ml-runtime/manifests/keep", data=json.dumps(manifest).encode(), method="PUT",
            headers={"Content-Type": manifest["mediaType"]})).close()
        orphan = _push_blob(host, "ml-runtime", b"orphan" * 1000)
        found = gc.collect(None, p, keep_days=7)
        assert [(i.name, i.bytes) for i in found.items if i.store == "registry"] == [(orphan, 6000)]
        blobs = folder / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256"
        assert (blobs / orphan[7:9] / orphan[7:] / "data").exists()  # the dry run removed nothing
        assert gc.remove(None, p, found) == []
        assert not (blobs / orphan[7:9] / orphan[7:]).exists()
        for kept in (config, layer):
            assert (blobs / kept[7:9] / kept[7:] / "data").exists()
        assert ping(host)  # it was running, so it runs again
        assert gc.collect(None, p).items == []
    finally:
        pid = gc._registry_pid(folder)
        if pid is not None:
            os.kill(pid, 15)


def test_after_build_removes_only_unreferenced_folders_older_than_a_day(project, tmp_path, monkeypatch):
    monkeypatch.setenv("BUILDER_WHEELHOUSE", str(tmp_path / "house"))
    p = load_project(project / "matrix.yaml")
    cpu = p.target("cpu").views()
    contexts = wheelhouse.location() / ".contexts"
    current = contexts / min(gc.current_contexts(p, cpu))
    current.mkdir(parents=True)
    _old(current, 30)
    stale = _old(_mk(contexts / ("9" * 32)), 2)
    fresh = _mk(contexts / ("8" * 32))  # another clone's, staged today
    gc.after_build(p, cpu)
    assert current.is_dir() and time.time() - current.stat().st_mtime < 60  # marked as used now
    assert not stale.exists() and fresh.is_dir()


def _mk(folder: Path) -> Path:
    (folder / "torch").mkdir(parents=True)
    return folder


def test_doctor_store_lines():
    from builder.host.doctor import store_checks

    lines = [c.line() for c in store_checks({"wheelhouse": (3_100_000_000, "/w"), "build cache": (0, "")})]
    assert lines == ["[OK]   store wheelhouse: 3.1 GB at /w; builder gc --dry-run: what can go",
                     "[OK]   store build cache: 0.0 GB; builder gc --dry-run: what can go"]
    assert store_checks(None, "no engine")[0].status == "warn"
    assert re.search("not measured", store_checks(None, "x")[0].line())
