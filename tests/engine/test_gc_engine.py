"""``builder gc`` on a real engine: planted stale wheels, staged folders, superseded content tags
and BuildKit's superseded wheel-context copies are listed by ``--dry-run`` (nothing removed) and
removed by ``gc``, which keeps everything current: the next build of cpu is reused."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from helpers import fetch_wheels, run_builder

from builder.config.project import load_project
from builder.images import gc, lockfile, wheelhouse
from devtools.support import edit_matrix

pytestmark = pytest.mark.engine

OLD = time.time() - 30 * 86400


def _import(engine, ref: str | None, payload: bytes, changes: list[str] | None = None) -> str:
    """A one-file image imported from a tar (no registry, no base), tagged *ref* (None: untagged): its ID."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("payload")
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    repo, tag = ref.rsplit(":", 1) if ref else (None, None)
    answer = engine.client.api.import_image_from_data(data.getvalue(), repository=repo, tag=tag, changes=changes)
    if ref is None:  # the engine's answer is JSON lines; the last status is the new image's ID
        return [json.loads(line)["status"] for line in answer.splitlines() if line.strip()][-1]
    return engine.client.api.inspect_image(ref)["Id"]


@pytest.fixture
def house(tmp_path, monkeypatch) -> Path:
    """A wheelhouse of this test's own, so gc never touches the shared one: the user's wheels brought in
    as the builder fetches them, by hard links (same file system)."""
    shared = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ml-image-builder" / "wheels"
    own = tmp_path / "house"
    own.mkdir()
    monkeypatch.setenv("BUILDER_WHEELHOUSE", str(own))
    fetch_wheels({f.name: f for f in shared.glob("*.whl")}, house=own, link=True)
    return own


@pytest.fixture
def own_project(based_project, registry, tmp_path) -> Path:
    """``based_project`` under a repository of its own: on the session's engine, the other tests'
    images of ``ml-runtime`` (other matrices, other content tags) are superseded for this checkout,
    and gc would list them (and remove what later tests still use). The base moves along, byte for byte."""
    root = tmp_path / "project"
    shutil.copytree(based_project, root, ignore=shutil.ignore_patterns("dist"))
    edit_matrix(root, registry=f"{registry}/gc-test")
    moved = run_builder("base", cwd=root)
    assert moved.returncode == 0, moved.stderr + moved.stdout
    return root


@pytest.mark.slow
def test_gc_dry_run_lists_then_gc_removes_exactly_the_stale(engine, own_project, house, no_leftovers):
    root = own_project
    build = run_builder("build", "-t", "cpu", "--json", "-q", cwd=root)
    assert build.returncode == 0, build.stderr[-3000:]
    project = load_project(root / "matrix.yaml")
    repo = project.target("cpu").primary_ref.rsplit(":", 1)[0]

    # Planted: wheels the builder fetched that no lock pins (one another clone used today: kept by
    # --keep-days), a folder it staged that no view names (linking a third), a note and another project's
    # month-old wheel (not the builder's: never touched), a superseded content tag (its image goes), one
    # a container uses (kept), another repository's.
    this = str(root.resolve())
    stale_wheel, young_wheel = house / "zz_stale-1.0-py3-none-any.whl", house / "zz_young-1.0-py3-none-any.whl"
    fetch_wheels({stale_wheel.name: b"w" * 5000}, clone=this)
    fetch_wheels({young_wheel.name: b"y" * 10}, clone=str(root.parent / "another-clone"))
    staged = lockfile.Pin("zz_staged", "1.0", hashlib.sha256(b"c" * 3000).hexdigest(), "zz_staged-1.0-py3-none-any.whl")
    fetch_wheels({staged.filename: b"c" * 3000}, clone=this)
    folder = wheelhouse.build_context({"torch": [staged]}, this)
    wheelhouse.release()
    note, theirs = house / "NOTES.txt", house / "otherproject-1.0-py3-none-any.whl"
    note.write_text("the team's notes")
    theirs.write_bytes(b"t" * 100)
    for path in (note, theirs, folder):
        os.utime(path, (OLD, OLD))
    superseded = f"{repo}:cpu-0123456789ab"
    used = f"{repo}:cpu-111111111111"
    other = "gc-test-other/x:cpu-0123456789ab"
    _import(engine, superseded, b"old image")
    _import(engine, used, b"in use")
    _import(engine, other, b"not ours")
    # An untagged image a build of cpu left (its label says so): garbage, nothing can name it.
    dangling = _import(engine, None, b"left by a build", changes=[f"LABEL {gc.TARGET_LABEL}=cpu"])
    container = engine.client.api.create_container(used, command=["/payload"])["Id"]
    try:
        stale_records = {r["ID"] for r in gc.stale_build_cache(engine.client.api.df().get("BuildCache") or [])}

        dry = run_builder("gc", "--dry-run", "--json", cwd=root)
        assert dry.returncode == 0, dry.stderr
        report = json.loads(dry.stdout)
        listed = {(i["store"], i["name"]): i["bytes"] for i in report["items"]}
        assert listed[("wheelhouse", stale_wheel.name)] == 5000
        assert listed[("contexts", str(folder))] == len("torch\n")  # its marker; its wheel is a link
        assert listed[("wheelhouse", staged.filename)] == 0  # linked from the folder: freed with it
        assert listed[("wheelhouse", "(wheels linked from the folders above)")] == 3000
        assert listed[("images", superseded)] > 0
        assert ("images", dangling) in listed
        assert {n for s, n in listed if s == "build cache"} == stale_records
        # Untagged images the session's other builds of this matrix's targets left (other checkouts) are
        # listed too, by label: one of the project's targets (docs/commands.md, "What the builder keeps").
        untagged = {n for s, n in listed if s == "images" and n.startswith("sha256:")}
        names = {t.name for t in project.targets}
        assert all(engine.client.api.inspect_image(n)["Config"]["Labels"][gc.TARGET_LABEL] in names for n in untagged)
        assert {(s, n) for s, n in listed} - {("images", n) for n in untagged} == (
            {("wheelhouse", stale_wheel.name), ("wheelhouse", staged.filename), ("contexts", str(folder)),
             ("wheelhouse", "(wheels linked from the folders above)"), ("images", superseded)}
            | {("build cache", r) for r in stale_records})
        assert sorted((i["name"], i["note"]) for i in report["kept"]) == sorted(
            [(used, "a container uses it"), (str(house), "2 files the builder did not fetch: never touched")])
        text = run_builder("gc", "--dry-run", cwd=root).stdout.splitlines()
        assert len(text) == len(gc.STORES) + 2 and text[0].startswith("wheelhouse: holds ")
        # Nothing removed by the dry run.
        assert stale_wheel.exists() and folder.exists()
        engine.client.api.inspect_image(superseded)

        done = run_builder("gc", "-v", cwd=root)
        assert done.returncode == 0, done.stderr + done.stdout
        assert not stale_wheel.exists() and not folder.exists() and not (house / staged.filename).exists()
        assert young_wheel.exists() and note.read_text() == "the team's notes" and theirs.exists()
        tags = {t for i in engine.client.images.list() for t in i.tags}
        assert superseded not in tags and used in tags and other in tags
        assert dangling not in {i.id for i in engine.client.images.list(all=True)}
        assert project.target("cpu").refs[0] in tags
        records = engine.client.api.df().get("BuildCache") or []
        assert not stale_records & {r["ID"] for r in records}
        kept = [r["Description"] for r in records if r["Description"].startswith(gc.WHEEL_SOURCE)]
        assert sorted(kept) == sorted(set(kept))  # one copy of each wheel context is left
        # Everything current stays: the next build of cpu is reused, and gc finds nothing more.
        again = run_builder("build", "-t", "cpu", "--json", "-q", cwd=root)
        assert again.returncode == 0, again.stderr[-2000:]
        assert json.loads(again.stdout)[0]["result"] == "reused-local"
        assert {(i["store"], i["name"]) for i in json.loads(run_builder("gc", "--dry-run", "--json", cwd=root).stdout)
                ["items"]} == set()
    finally:
        engine.client.api.remove_container(container, force=True)
        for ref in (used, other, superseded, dangling):
            subprocess.run(["docker", "rmi", ref], capture_output=True, check=False)
