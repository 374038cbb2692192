"""``builder gc`` on a real engine: planted stale wheels, staged folders and superseded images the
builder recorded are listed by ``--dry-run`` (nothing removed) and removed by ``gc``, which keeps
everything current (the next build of cpu is reused) and everything not its own or still used: an
image pulled by digest, an image a file names by digest, another clone's image and wheel-context
copies within ``--keep-days``, an image a live build holds.

Each test has a state folder of its own (``XDG_CACHE_HOME``: the leases and ledgers), so its gc
judges what it recorded alone, and a wheelhouse of its own."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import pytest
from helpers import fetch_wheels, run_builder

from builder.config.ownership import clone_id
from builder.config.project import load_project
from builder.gc import owned
from builder.gc import stores as gc
from builder.wheels import contexts, images, layers, lockfile, wheelhouse
from devtools.support import copy_project, edit_matrix

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
    as the builder fetches them, by hard links (same file system), as used today by the other clones that
    share the user's wheelhouse (what it holds beyond this project's locks depends on the machine)."""
    shared = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ml-image-builder" / "wheels"
    own = tmp_path / "house"
    own.mkdir()
    monkeypatch.setenv("BUILDER_WHEELHOUSE", str(own))
    fetch_wheels({f.name: f for f in shared.glob("*.whl")}, clone=str(shared), house=own, link=True)
    return own


@pytest.fixture
def state(house, tmp_path, monkeypatch) -> Path:
    """A state folder of this test's own (after ``house`` found the shared wheelhouse): the leases and
    ledgers the builder's commands and this test write, so gc judges this test's records alone."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


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


TARGET_LABEL = "io.ml-image-builder.target"


def _gc(root: Path, *args: str) -> dict:
    done = run_builder("gc", "--json", *args, cwd=root)
    assert done.returncode in (0, 1), done.stderr + done.stdout
    return json.loads(done.stdout)


def _exists(engine, image: str) -> bool:
    return engine.image(image) is not None


def _pruned(report: dict) -> set[str]:
    """The build cache records a gc run removed."""
    return {i["name"] for i in report["items"] if i["store"] == "build cache"}


def _kept(report: dict, name: str) -> str | None:
    return next((i["note"] for i in report["kept"] if i["name"] == name), None)


def _change_runtime(root: Path) -> None:
    with (root / "runtime/ml_runtime/errors.py").open("a") as handle:
        handle.write(f"\n# {uuid.uuid4().hex}: a change the image carries\n")


@pytest.mark.slow
def test_gc_dry_run_lists_then_gc_removes_exactly_the_stale(engine, own_project, house, state, no_leftovers):
    root = own_project
    build = run_builder("build", "-t", "cpu", "--json", "-q", cwd=root)
    assert build.returncode == 0, build.stderr[-3000:]
    project = load_project(root / "matrix.yaml")
    repo = project.target("cpu").primary_ref.rsplit(":", 1)[0]
    built = json.loads(build.stdout)[0]["image_id"]
    assert owned.images_ledger(engine).records()[built].clones == {clone_id(root): pytest.approx(time.time(), abs=600)}
    copies = owned.build_cache_ledger(engine).records()
    view = project.target("cpu").default_view
    served = images.refs(layers.context_layers(project, view), view.platform).values()
    if engine.serves_image_contexts(None):  # the wheel contexts are images, recorded as the builder's: no copies
        assert not copies
        recorded = {t for r in owned.images_ledger(engine).records().values() for t in r.facts.get("tags", ())}
        assert set(served) <= recorded
    else:
        assert copies and all(r.facts["description"].startswith(owned.WHEEL_SOURCE) for r in copies.values())

    # Planted: wheels the builder fetched that no lock pins (one another clone used today: kept by
    # --keep-days), a folder it staged that no view names (linking a third), a note and another project's
    # month-old wheel (not the builder's: never touched); images an older build of this checkout made
    # (recorded as the executor records them): a superseded content tag (its image goes), one a container
    # uses (kept), an untagged one (goes); and images not the builder's: another repository's, an untagged
    # one labelled with a target (never touched).
    this = str(root.resolve())
    stale_wheel, young_wheel = house / "zz_stale-1.0-py3-none-any.whl", house / "zz_young-1.0-py3-none-any.whl"
    fetch_wheels({stale_wheel.name: b"w" * 5000}, clone=this)
    fetch_wheels({young_wheel.name: b"y" * 10}, clone=str(root.parent / "another-clone"))
    staged = lockfile.Pin("zz_staged", "1.0", hashlib.sha256(b"c" * 3000).hexdigest(), "zz_staged-1.0-py3-none-any.whl")
    fetch_wheels({staged.filename: b"c" * 3000}, clone=this)
    folder = contexts.build_context({"torch": [staged]}, this)
    stale_context = None  # the image a build of an older lock served that layer as (where the engine reads those)
    if engine.serves_image_contexts(None):
        (ref, stale_context), = images.serve(engine, folder, {"torch": [staged]}, "linux/amd64").values()
        owned.record_image(engine, project, stale_context, "cpu", [ref])
    wheelhouse.release()
    note, theirs = house / "NOTES.txt", house / "otherproject-1.0-py3-none-any.whl"
    note.write_text("the team's notes")
    theirs.write_bytes(b"t" * 100)
    for path in (note, theirs, folder):
        os.utime(path, (OLD, OLD))
    superseded = f"{repo}:cpu-0123456789ab"
    used = f"{repo}:cpu-111111111111"
    other = "gc-test-other/x:cpu-0123456789ab"
    superseded_id = _import(engine, superseded, b"old image")
    used_id = _import(engine, used, b"in use")
    _import(engine, other, b"not ours")
    left = _import(engine, None, b"left by a build", changes=[f"LABEL {TARGET_LABEL}=cpu"])
    foreign = _import(engine, None, b"not the builder's", changes=[f"LABEL {TARGET_LABEL}=cpu"])
    for image, given in ((superseded_id, [superseded]), (used_id, [used]), (left, [])):
        owned.record_image(engine, project, image, "cpu", given)
    container = engine.client.api.create_container(used, command=["/payload"])["Id"]
    try:
        stale_copies = {r.id for r in owned.stale_wheel_sources(
            engine.build_cache(), owned.build_cache_ledger(engine).records(), clone=clone_id(root), keep_days=7)}

        dry = run_builder("gc", "--dry-run", "--json", cwd=root)
        assert dry.returncode == 0, dry.stderr
        report = json.loads(dry.stdout)
        listed = {(i["store"], i["name"]): i["bytes"] for i in report["items"]}
        assert listed[("wheelhouse", stale_wheel.name)] == 5000
        assert listed[("contexts", str(folder))] == len("torch\n")  # its marker; its wheel is a link
        assert listed[("wheelhouse", staged.filename)] == 0  # linked from the folder: freed with it
        assert listed[("wheelhouse", "(wheels linked from the folders above)")] == 3000
        assert listed[("images", superseded_id)] > 0
        assert set(listed) == ({("wheelhouse", stale_wheel.name), ("wheelhouse", staged.filename),
                                ("contexts", str(folder)), ("wheelhouse", "(wheels linked from the folders above)"),
                                ("images", superseded_id), ("images", left)}
                               | {("build cache", r) for r in stale_copies}
                               | ({("images", stale_context)} if stale_context else set()))
        assert sorted((i["name"], i["note"]) for i in report["kept"]) == sorted(
            [(used_id, f"{used}: a container uses it"),
             (str(house), "2 files the builder did not fetch: never touched")])
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
        assert not _exists(engine, superseded_id) and not _exists(engine, left)
        assert stale_context is None or not _exists(engine, stale_context)
        assert all(_exists(engine, ref) for ref in served), "a current wheel context's image went"
        assert _exists(engine, foreign), "an image the builder did not record was removed"
        assert project.target("cpu").refs[0] in tags
        assert not stale_copies & {r.id for r in engine.build_cache()}
        assert set(owned.build_cache_ledger(engine).records()) <= {r.id for r in engine.build_cache()}
        # Everything current stays: the next build of cpu is reused, and gc finds nothing more.
        again = run_builder("build", "-t", "cpu", "--json", "-q", cwd=root)
        assert again.returncode == 0, again.stderr[-2000:]
        assert json.loads(again.stdout)[0]["result"] == "reused-local"
        assert {(i["store"], i["name"]) for i in json.loads(run_builder("gc", "--dry-run", "--json", cwd=root).stdout)
                ["items"]} == set()
    finally:
        engine.client.api.remove_container(container, force=True)
        for ref in (used, other, superseded, left, foreign):
            subprocess.run(["docker", "rmi", ref], capture_output=True, check=False)


def test_an_image_pulled_by_digest_stays_and_one_a_file_names_by_digest_stays_while_it_does(
        engine, own_project, state, registry, tmp_path, no_leftovers):
    """``builder slurm`` and ``builder k8s`` name images by digest. An image pulled that way (labelled with
    one of the targets, untagged: what gc took for a build's leftover on the classic store) is not the
    builder's and stays. An image the builder built and published, whose content tag this checkout has
    since moved on from (gc removed it at once), stays while dist/published.json, then the script
    ``builder slurm`` wrote from it, names its digest; then it goes."""
    root = own_project
    project = load_project(root / "matrix.yaml")
    repo = project.target("cpu").primary_ref.rsplit(":", 1)[0]
    pushed = f"{registry}/gc-digest:{uuid.uuid4().hex[:8]}"
    _import(engine, pushed, uuid.uuid4().bytes, changes=[f"LABEL {TARGET_LABEL}=cpu"])
    pulled_digest = engine.push(pushed)
    engine.client.api.remove_image(pushed)
    engine.pull(f"{pushed.rsplit(':', 1)[0]}@{pulled_digest}")
    pulled = engine.image(f"{pushed.rsplit(':', 1)[0]}@{pulled_digest}")
    assert pulled is not None and not pulled.tags
    old_tag = f"{repo}:cpu-{uuid.uuid4().hex[:12]}"  # a content tag of an earlier build of this checkout
    published = _import(engine, old_tag, uuid.uuid4().bytes, changes=[f"LABEL {TARGET_LABEL}=cpu"])
    digest = engine.push(old_tag)
    owned.record_image(engine, project, published, "cpu", [old_tag])  # as the build that made it recorded it
    (root / "dist").mkdir(exist_ok=True)
    (root / "dist" / "published.json").write_text(json.dumps({"cpu": {"reference": f"{repo}@{digest}",
                                                                      "digest": digest}}))
    try:
        report = _gc(root)
        assert _exists(engine, pulled.id), "gc removed an image pulled by digest"
        assert _exists(engine, published), "gc removed the image dist/published.json names by digest"
        assert pulled.id not in {i["name"] for i in report["items"]}
        assert _kept(report, published) == f"{old_tag}: {root / 'dist' / 'published.json'} names it by digest"
        # The script builder slurm wrote from it names it once published.json has moved on.
        script = tmp_path / "job.sbatch"
        slurm = run_builder("slurm", "-t", "cpu", "--nodes", "1", "--script", str(script), "--",
                            "/opt/examples/train.py", cwd=root)
        assert slurm.returncode == 0, slurm.stderr
        assert digest in script.read_text()
        (root / "dist" / "published.json").unlink()
        report = _gc(root)
        assert _exists(engine, published) and _kept(report, published) == f"{old_tag}: {script} names it by digest"
        # Nothing names it any more: recorded and unused, it goes; the pulled one still stays.
        script.unlink()
        report = _gc(root)
        assert published in {i["name"] for i in report["items"]}
        assert not _exists(engine, published) and _exists(engine, pulled.id)
    finally:
        for image in (pulled.id, old_tag, published):
            engine.remove_image(image)


@pytest.mark.slow
@pytest.mark.classic
def test_another_clones_image_and_wheel_copies_survive_gc_within_keep_days(engine, own_project, state, tmp_path,
                                                                           no_leftovers):
    """Two clones sharing the engine and the wheelhouse (issue 40: clone B's image, built with a change
    of its own, was removed by clone A's gc, and B's next build started from nothing). B builds cpu,
    then A does; A's gc keeps B's image (its content tag) and B's copies of the wheel contexts;
    ``--keep-days 0`` (this checkout alone counts) removes them. Where the wheel contexts are images
    (the containerd store) there are no copies, and those images, current for A too, stay; the
    `classic` run (a classic-store dockerd) checks the copies."""
    a = own_project
    b = tmp_path / "clone-b"
    shutil.copytree(a, b, ignore=shutil.ignore_patterns("dist"))
    _change_runtime(b)
    built_b = run_builder("build", "-t", "cpu", "--json", "-q", cwd=b)
    assert built_b.returncode == 0, built_b.stderr[-3000:]
    b_image = json.loads(built_b.stdout)[0]["image_id"]
    b_tag = json.loads(built_b.stdout)[0]["content_tag"]
    built_a = run_builder("build", "-t", "cpu", "--json", "-q", cwd=a)
    assert built_a.returncode == 0, built_a.stderr[-3000:]
    a_image = json.loads(built_a.stdout)[0]["image_id"]
    assert a_image != b_image
    copies = owned.build_cache_ledger(engine).records()
    b_copies = {rid for rid, r in copies.items() if list(r.clones) == [clone_id(b)]}
    assert bool(b_copies) != engine.serves_image_contexts(None), "B's build made wheel-context copies of its own"
    project = load_project(a / "matrix.yaml")
    view = project.target("cpu").default_view
    served = images.refs(layers.context_layers(project, view), view.platform).values() \
        if engine.serves_image_contexts(None) else ()
    try:
        report = _gc(a)
        assert _exists(engine, b_image) and b_tag in {t for i in engine.client.images.list() for t in i.tags}
        assert _kept(report, b_image) == f"{b_tag}: clone {clone_id(b)} used it 0.0 days ago (--keep-days 7)"
        assert not b_copies & _pruned(report), "A's gc pruned B's copies of the wheel contexts"
        # What A's gc did, not what the engine holds: BuildKit's own GC may drop some of B's copies meanwhile on
        # an engine holding other contexts too (Docker's first GC rule keeps 4.1 GiB of build contexts with
        # defaultKeepStorage 30GB, the least recently used go first: a fresh clone's CI run exceeded it).
        left = b_copies & {r.id for r in engine.build_cache()}

        report = _gc(a, "--keep-days", "0")
        assert not _exists(engine, b_image)
        assert left <= _pruned(report)
        assert not b_copies & {r.id for r in engine.build_cache()}
        assert _exists(engine, a_image), "A's current image went"
        assert all(_exists(engine, ref) for ref in served), "the wheel contexts' images A builds from went"
    finally:
        engine.remove_image(b_tag)


def test_an_untagged_image_a_live_build_holds_stays_until_its_run_ends(engine, own_project, state, tmp_path,
                                                                       no_leftovers):
    """A build in clone B has exported its image, not yet tagged (it is smoke-testing it): the run holds
    it in the ledger, recorded by the executor's own call (builder.gc.owned.record_image). Clone A's
    gc, even with ``--keep-days 0``, keeps it while B's run lives; after B's run is killed it goes."""
    a = own_project
    b = copy_project(tmp_path / "clone-b")
    image = _import(engine, None, uuid.uuid4().bytes, changes=[f"LABEL {TARGET_LABEL}=cpu"])
    code = ("import sys, time; from builder.config.project import load_project; from builder.gc import owned; "
            "from builder.oci.docker import DockerEngine; "
            f"owned.record_image(DockerEngine.from_env(), load_project({str(b / 'matrix.yaml')!r}), {image!r}, 'cpu', "
            "hold=True); print('held', flush=True); time.sleep(600)")
    run_b = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=b)
    try:
        assert run_b.stdout is not None and run_b.stdout.readline().strip() == "held"
        report = _gc(a, "--keep-days", "0")
        assert _exists(engine, image), "gc removed the untagged image of a build under way"
        assert _kept(report, image) == "untagged: a running build holds it"
        run_b.send_signal(signal.SIGKILL)
        run_b.wait()
        report = _gc(a, "--keep-days", "0")
        assert image in {i["name"] for i in report["items"]} and not _exists(engine, image)
    finally:
        run_b.kill()
        run_b.wait()
        engine.remove_image(image)
