"""``builder gc``'s selection, without an engine: which wheels, staged folders, BuildKit records and
recorded images go (builder.gc.owned decides from records and docker's listings, here written
out; the loopback registry's blobs: tests/test_local_registry.py)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
from doubles import NoEngine
from helpers import fetch_wheels

from builder.config.ownership import Record, run_token
from builder.config.project import Project, load_project
from builder.gc import owned
from builder.gc import stores as gc
from builder.oci.engine import CacheRecord, ImageFacts
from builder.wheels import contexts, lockfile, wheelhouse
from devtools.support import copy_project

DAY = 86400


def _old(path: Path, days: float) -> Path:
    t = time.time() - days * DAY
    os.utime(path, (t, t))
    return path


def test_select_files_takes_only_the_builder_s_that_nothing_wants_holds_or_used_lately(tmp_path):
    """What goes: recorded (a wheel the builder fetched), not wanted by this checkout, held by no live run,
    used by no other clone within keep_days; a wheel a kept folder links stays. Nothing unrecorded goes."""
    house = tmp_path / "house"
    (house / ".contexts").mkdir(parents=True)
    one, two, long_ago = "/src/one", "/src/two", time.time() - 30 * DAY
    records: dict[str, Record] = {}

    def wheel(name: str, **clones: float) -> Path:
        path = house / f"{name}-1.0-py3-none-any.whl"
        path.write_bytes(b"x" * 100)
        records[path.name] = Record({"fetched": True}, long_ago, {one: long_ago, **clones})
        return path

    def folder(name: str, **clones: float) -> Path:
        path = _mk(house / ".contexts" / (name * 32))
        records[f".contexts/{path.name}"] = Record({}, long_ago, {one: long_ago, **clones})
        return path

    wanted, stale, used_by_two, linked = wheel("a"), wheel("b"), wheel("c", **{two: time.time()}), wheel("d")
    theirs = house / "e-1.0-py3-none-any.whl"  # not recorded: another project's
    theirs.write_bytes(b"e")
    found = house / "f-1.0-py3-none-any.whl"  # verified against a lock, but found there: not fetched
    found.write_bytes(b"f")
    records[found.name] = Record({"verified": [*wheelhouse.stat_key(found.stat()), "f" * 64]}, long_ago, {one: long_ago})
    (house / "NOTES.txt").write_text("ours, not the builder's")
    current, old = folder("1"), folder("3")
    other_clone = folder("2", **{two: time.time()})  # another clone staged it today
    os.link(linked, other_clone / "torch" / linked.name)
    unrecorded = _mk(house / ".contexts" / ("4" * 32))
    (house / ".ledger.json").write_text("{}")
    chosen = gc.select_files(house, records, {wanted.name}, {current.name}, one, keep_days=7)
    assert (chosen.folders, chosen.wheels, chosen.held) == ([old], [stale], [])
    assert set(chosen.foreign) == {theirs, found, house / "NOTES.txt", unrecorded}
    # --keep-days 0: only this checkout counts; the other clone's folder and wheel go too, never what isn't ours.
    chosen = gc.select_files(house, records, {wanted.name}, {current.name}, one, keep_days=0)
    assert set(chosen.folders) == {other_clone, old}
    assert set(chosen.wheels) == {stale, used_by_two, linked}
    assert set(chosen.foreign) == {theirs, found, house / "NOTES.txt", unrecorded}


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
           kind: str = "source.local") -> CacheRecord:
    return CacheRecord(i, kind, desc, size=1, in_use=in_use, last_used="2026-01-01T00:00:00Z")


def test_a_wheel_context_copy_goes_only_when_not_ours_current_and_no_other_clone_uses_it():
    """A clone's current copy is the one its last build of that context name used (one build's copies
    share one time of use: BuildKit keeps two of each context name per clone), never BuildKit's
    LastUsedAt; a copy this clone never used goes once no other clone used it within --keep-days."""
    now = time.time()
    last, before = now - DAY, now - 2 * DAY
    records = {"a": Record(clones={"/a": last}), "a2": Record(clones={"/a": last}),  # this clone's last build: both
               "b": Record(clones={"/a": before}),                                # ours, superseded: goes
               "d": Record(clones={"/a": before}),                                # in use: never
               "e": Record(clones={"/a": before, "/b": now - 60}),                # clone /b used it a minute ago
               "f": Record(clones={"/a": before})}                                # /a's only copy of its name
    cache = [_cache("a"), _cache("a2"), _cache("b"), _cache("c"), _cache("d", in_use=True), _cache("e"),
             _cache("f", desc="local source for wheels-common"), _cache("g", kind="regular")]

    def stale(clone, keep_days):
        return [r.id for r in owned.stale_wheel_sources(cache, records, clone=clone, keep_days=keep_days, now=now)]

    assert stale("/a", 7) == ["b"]
    assert stale("/a", 0) == ["b", "e"]                   # /b's use is older than 0 days
    assert stale("/new", 7) == []                         # others used each within 7 days
    assert stale("/new", 0) == ["a", "a2", "b", "e", "f"]  # never /new's: only others used them
    assert stale("/b", 7) == []
    assert stale("/b", 0) == ["a", "a2", "b", "f"]        # e is /b's current copy of wheels-torch


class _Cache(NoEngine):
    """An engine's build-cache listing (the engine test: tests/engine/test_gc_engine.py)."""

    def __init__(self, cache: list[CacheRecord]) -> None:
        self.cache = cache

    def name(self) -> str:
        return "docker"

    def store_key(self) -> str:
        return "unix:///nowhere.sock"

    def build_cache(self) -> list[CacheRecord]:
        return self.cache


def test_a_build_records_its_copies_and_forgets_those_the_engine_no_longer_has(own_state, tmp_path):
    """After a build: the copies of its contexts whose use moved are recorded as this clone's; the
    records of copies the engine no longer has go (BuildKit's GC pruned them), unless used since the
    build began (another clone's build that is recording its own)."""
    engine, project = _Cache([]), cast(Project, SimpleNamespace(root=tmp_path / "clone"))
    ledger = owned.build_cache_ledger(engine)
    ledger.record_many(["pruned", "kept", "recent"], clone="/other")
    start = time.time()
    with ledger.editing() as records:
        for key in ("pruned", "kept"):
            records[key].clones["/other"] = records[key].recorded = start - DAY
        records["recent"].clones["/other"] = start + 1
    engine.cache = [_cache("kept"), _cache("new"), _cache("moved"), _cache("still"),
                    _cache("other", desc="local source for wheels-common")]
    before = owned.wheel_sources(engine, ["wheels-torch"])  # the listing as it was before the build:
    del before["new"]  # the build made this copy,
    before["moved"] = (None, 1)  # and used this one
    used = owned.record_wheel_sources(engine, project, ["wheels-torch"], before, since=start)
    assert used == ["moved", "new"]
    assert sorted(ledger.records()) == ["kept", "moved", "new", "recent"]


def test_which_recorded_images_go_and_why_the_others_stay(tmp_path):
    """builder.gc.owned.verdict: only recorded images, never a current one, one a live run holds or
    builds, one another clone used within --keep-days, one a container uses, one a file names by digest."""
    now = time.time()
    live = run_token()
    dead = subprocess.run([sys.executable, "-c", "from builder.config.ownership import run_token; print(run_token())"],
                          capture_output=True, text=True, check=True).stdout.strip()

    def rec(tags=("r:t0-aa",), target="t0", clones=None, runs=()):
        return Record(facts={"target": target, "tags": list(tags)}, recorded=now - 9 * DAY,
                      clones=clones or {"/a": now - 2 * DAY}, runs=list(runs))

    def img(i, tags=("r:t0-aa",), containers=0, digests=()):
        return ImageFacts(i, tags=tuple(tags), digests=tuple(digests), containers=containers)

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


def test_after_build_removes_only_the_builder_s_unwanted_folders_no_other_clone_used_lately(project, tmp_path,
                                                                                              monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("BUILDER_WHEELHOUSE", str(tmp_path / "house"))
    p = load_project(project / "matrix.yaml")
    pin = lockfile.Pin("a", "1.0", hashlib.sha256(b"a").hexdigest(), "a-1.0-py3-none-any.whl")
    fetch_wheels({pin.filename: b"a"})
    this, other = str(project.resolve()), str(tmp_path / "other-clone")
    mine = contexts.build_context({"torch": [pin]}, this)  # staged by this checkout, no current view's
    theirs = contexts.build_context({"torch": [pin], "packages": []}, other)  # another clone's, staged now
    unrecorded = _mk(wheelhouse.location() / ".contexts" / ("8" * 32))
    wheelhouse.release()  # the engine is done with them
    gc.after_build(p)
    assert not mine.exists() and theirs.is_dir() and unrecorded.is_dir()


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


@pytest.fixture
def own_state(tmp_path, monkeypatch) -> Path:
    """A state folder (run leases, no loopback registry) and a wheelhouse of this test's own; the wheelhouse."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("BUILDER_WHEELHOUSE", str(tmp_path / "house"))
    return wheelhouse.location()


def test_gc_leaves_what_the_builder_did_not_fetch_and_says_so_once(project, own_state):
    """``BUILDER_WHEELHOUSE=/srv/team-wheels builder gc``: a note and another project's month-old wheel
    were taken for the builder's by their age; only a wheel the builder fetched goes."""
    house = own_state
    note = house / "README.txt"
    note.write_text("team wheels, ask Ana\n")
    _old(note, 30)
    theirs = house / "otherproject-2.0-py3-none-any.whl"
    theirs.write_bytes(b"their wheel" * 100)
    _old(theirs, 30)
    fetch_wheels({"stale-1.0-py3-none-any.whl": b"s" * 100})  # the builder's; no lock of this checkout pins it
    p = load_project(project / "matrix.yaml")
    found = gc.collect(None, p, keep_days=7)
    assert [(i.store, i.name) for i in found.items] == [("wheelhouse", "stale-1.0-py3-none-any.whl")]
    lines = gc.report_lines(found, verbose=False, dry_run=True)
    assert [line for line in lines if line.startswith("kept")] == [
        f"kept wheelhouse: {house}: 2 files the builder did not fetch: never touched"]
    assert gc.remove(None, p, found) == []
    assert note.read_text() == "team wheels, ask Ana\n"
    assert theirs.read_bytes() == b"their wheel" * 100
    assert not (house / "stale-1.0-py3-none-any.whl").exists()


def test_wheels_fetched_before_the_ledger_are_the_builder_s_only_where_it_can_prove_it(project, own_state):
    """A wheelhouse from before the ledger: the builder stamped in ``.verified.json`` each file it had
    verified against a lock's sha256. A file whose stat is still its stamp, or whose bytes still hash to
    it, is the builder's (and keeps its age for --keep-days); an altered or unstamped one is not."""
    house = own_state
    files = {name: name.encode() * 100 for name in ("same", "linked", "altered", "young", "unstamped")}
    paths = {name: house / f"{name}-1.0-py3-none-any.whl" for name in files}
    for name, path in paths.items():
        path.write_bytes(files[name])
        if name != "young":
            _old(path, 30)
    stamps = {paths[n].name: wheelhouse.stamp(paths[n], hashlib.sha256(files[n]).hexdigest())
              for n in ("same", "linked", "altered", "young")}
    (house / ".verified.json").write_text(json.dumps(stamps))
    os.link(paths["linked"], house.parent / "a-link")  # moves its ctime: the stamp no longer matches its stat
    with paths["altered"].open("r+b") as handle:
        handle.write(b"X")
    p = load_project(project / "matrix.yaml")
    found = gc.collect(None, p, keep_days=7)
    assert sorted(i.name for i in found.items) == [paths["linked"].name, paths["same"].name]
    assert not (house / ".verified.json").exists() and (house / wheelhouse.LEDGER).is_file()
    gc.remove(None, p, found)
    assert sorted(p.name for p in house.iterdir() if not p.name.startswith(".")) == [
        paths["altered"].name, paths["unstamped"].name, paths["young"].name]
    assert gc.collect(None, p, keep_days=0).items == [gc.Item("wheelhouse", paths["young"].name, 500)]


HOLDER = """
import json, sys
from builder.wheels import contexts
from builder.wheels.lockfile import Pin
folder = contexts.build_context({"torch": [Pin(**p) for p in json.loads(sys.argv[2])]}, sys.argv[1])
print(folder, flush=True)
sys.stdin.readline()  # holds what it staged (its run lease) until told to end
"""


@pytest.mark.parametrize("end", ["ends", "is killed"])
def test_a_folder_another_clone_s_live_build_holds_stays_until_that_build_ends(tmp_path, own_state, end):
    """Two clones share the wheelhouse. The other one's build (a process holding its run lease) staged a
    folder long ago and reads it now (a reused folder keeps its old mtime); this clone's ``builder gc``
    and the clean-up after its builds leave it, even with --keep-days 0, until that build ends (or is
    killed: SIGKILL); then the next gc removes it."""
    one, two = copy_project(tmp_path / "one"), copy_project(tmp_path / "two")
    p = load_project(one / "matrix.yaml")
    pin = lockfile.Pin("extra", "1.0", hashlib.sha256(b"extra").hexdigest(), "extra-1.0-py3-none-any.whl")
    fetch_wheels({pin.filename: b"extra"})
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(two.resolve()), json.dumps([vars(pin)])],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        folder = Path(holder.stdout.readline().strip())
        assert folder.parent == own_state / ".contexts" and folder.name not in gc.current_contexts(p)
        _old(folder, 30)
        gc.after_build(p, keep_days=0)
        assert folder.is_dir()
        found = gc.collect(None, p, keep_days=0)
        assert str(folder) not in {i.name for i in found.items}
        assert gc.Item("contexts", str(folder), 0, "a live build holds it") in found.kept
        gc.remove(None, p, found)
        assert folder.is_dir()
        if end == "is killed":
            holder.send_signal(signal.SIGKILL)
        else:
            holder.stdin.write("done\n")
            holder.stdin.flush()
        holder.wait(timeout=60)
        assert str(folder) not in {i.name for i in gc.collect(None, p, keep_days=7).items}  # clone two used it today
        found = gc.collect(None, p, keep_days=0)
        assert str(folder) in {i.name for i in found.items}
        gc.remove(None, p, found)
        assert not folder.exists()
    finally:
        holder.kill()
        holder.wait()


class _Images(_Cache):
    """An engine's images by ID, and what was removed (the engine test: tests/engine/test_gc_engine.py)."""

    def __init__(self, found: dict[str, ImageFacts]) -> None:
        super().__init__([])
        self.found, self.removed, self.asked = found, list[str](), list[str]()

    def image(self, ref: str) -> ImageFacts | None:
        self.asked.append(ref)
        return self.found.get(ref) or next((i for i in self.found.values() if ref in i.tags), None)

    def remove_image(self, ref: str) -> str | None:
        self.removed.append(ref)
        self.found = {i: f for i, f in self.found.items() if ref != i and ref not in f.tags}
        return None


def test_a_build_removes_the_wheel_context_images_of_superseded_locks(own_state, tmp_path):
    """After a build (builder.gc.stores.after_build): the wheel contexts' images the builder recorded that
    no current lock names go, a day on; a current one, one another clone used within the day, one a
    running build holds, and an image that is not a context's (a target's: builder gc's) stay. The
    engine is not asked about the current one (an inspection each, after every build)."""
    ctx = "ml-image-builder.invalid/contexts/wheels-torch:"
    found = {i: ImageFacts(i, tags=(tag,)) for i, tag in (
        ("sha256:old", ctx + "old"), ("sha256:now", ctx + "now"), ("sha256:theirs", ctx + "theirs"),
        ("sha256:held", ctx + "held"), ("sha256:target", "r:cpu-aa"))}
    engine, project = _Images(found), cast(Project, SimpleNamespace(root=tmp_path / "clone"))
    for image_id, image in found.items():
        owned.record_image(engine, project, image_id, "cpu", image.tags, hold=image_id == "sha256:held")
    with owned.images_ledger(engine).editing() as records:
        for record in records.values():
            record.recorded = next(iter(record.clones.values())) - 2 * DAY
            record.clones = {str(project.root.resolve()): record.recorded}
        records["sha256:theirs"].clones["/another-clone"] = time.time()
    gone = gc.remove_stale_context_images(engine, project, {ctx + "now"}, keep_days=1)
    assert gone == ["sha256:old"] and "sha256:now" not in engine.asked
    assert engine.removed == [ctx + "old"] and set(engine.found) == set(found) - {"sha256:old"}
    owned.release_image(engine, "sha256:held")
    assert gc.remove_stale_context_images(engine, project, {ctx + "now"}, keep_days=1) == ["sha256:held"]
