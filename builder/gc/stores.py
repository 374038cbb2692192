"""``builder gc``: what the builder's stores hold, and removing what no current lock or target references.

Five stores (:func:`collect` finds what goes, :func:`remove` removes it):

- **wheelhouse** (:func:`builder.wheels.wheelhouse.location`): a wheel the builder fetched (its
  ledger records it: :mod:`builder.wheels.wheelhouse`) that no lock under ``images/`` of this
  checkout pins, no live build holds and no other clone used within ``keep_days`` (the wheelhouse is
  shared by every clone of the user, and beyond); one hard-linked from a staged folder that is kept
  stays too. A file the builder did not fetch (a note, another project's wheel) is never touched:
  the report says how many there are, once.
- **contexts** (``<wheelhouse>/.contexts/<hash>``): a folder the builder staged (recorded) that is
  no current target view's :func:`~builder.wheels.contexts.context_folder`, that no live build
  holds (a build holds what it staged until the engine is done with it) and no other clone used
  within ``keep_days``.
- **build cache**: BuildKit's copies of the wheel contexts (``local source for wheels-<layer>``)
  that the builder's builds made or used (:mod:`builder.gc.owned` records them), that this
  checkout's last build of that context did not use, and no other clone used within ``keep_days``.
  Pruned through ``docker buildx prune --filter id=...``, never by touching the engine's files;
  records in use are never pruned, nor any copy the builder did not record.
- **images**: images the builder recorded (:mod:`builder.gc.owned`: built, pulled, or reused
  by a build, and the wheel contexts' images a build loaded: :mod:`builder.wheels.images`) that
  carry no current tag of this checkout (the caller's, with the current wheel contexts' names): their tags the builder gave go, and the
  image with them unless another name keeps it; never one a live build holds, one of a target a
  build is building, one another clone used within ``keep_days``, one a container uses, or one a
  file names by digest (``dist/published.json``, ``base.lock.json``, a ``builder slurm`` script).
- **registry**: blobs of the builder's loopback registry (:mod:`builder.oci.localregistry`) no
  manifest references: ``docker-registry garbage-collect``, with that registry stopped (its docs ask
  it read-only or stopped) and started again when it was running; never while another run holds it
  (a build pushing there), never unless it stopped (its blobs are then left, in one line). A registry
  the builder did not start, and every manifest, are never touched.

Deleting from the wheelhouse happens under its lock, decided again there, so a concurrent build
never loses a file it is staging.

Example:
    >>> found = collect(connect(), project, keep_days=7, current=current_refs(project))  # doctest: +SKIP
    >>> [f"{s.store}: {human(s.freed)}" for s in found.summary()]  # doctest: +SKIP
    ['wheelhouse: 1.2 GB', 'contexts: 0 B', 'build cache: 310 MB', 'images: 40 MB', 'registry: 0 B']
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from builder.config.files import locked
from builder.config.ownership import REFERENCES, Ledger, Record, clone_id
from builder.config.project import Project, TargetView
from builder.gc import owned
from builder.oci import contextimages, localregistry
from builder.oci.engine import Engine, ImageFacts
from builder.wheels import contexts, images, layers, lockfile, wheelhouse

STORES = ("wheelhouse", "contexts", "build cache", "images", "registry")
#: Default of ``--keep-days``: another clone that builds weekly keeps its wheels.
KEEP_DAYS = 7


@dataclass(frozen=True)
class Item:
    """One thing that goes: its store, what it is, and the bytes removing it frees."""

    store: str
    name: str
    bytes: int
    note: str = ""


@dataclass(frozen=True)
class Store:
    store: str
    held: int
    freed: int
    items: int
    where: str = ""


@dataclass
class Found:
    """What each store holds and what goes."""

    held: dict[str, int] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)
    items: list[Item] = field(default_factory=list)
    kept: list[Item] = field(default_factory=list)  # would go but can't (in use): said, not removed
    keep_days: float = KEEP_DAYS
    started: float = field(default_factory=time.time)  # when collect looked
    #: the tags this checkout's views give an image now: an image carrying one stays
    current: frozenset[str] = frozenset()

    def summary(self) -> list[Store]:
        return [Store(s, self.held.get(s, 0), sum(i.bytes for i in self.items if i.store == s),
                      sum(1 for i in self.items if i.store == s), self.where.get(s, "")) for s in STORES]

    def as_dict(self) -> dict[str, Any]:
        return {"stores": [asdict(s) for s in self.summary()], "items": [asdict(i) for i in self.items],
                "kept": [asdict(i) for i in self.kept]}


def human(n: float) -> str:
    """Bytes, human readable (powers of 1000, as docker prints them).

    Example:
        >>> human(0), human(1234), human(5_600_000_000)
        ('0 B', '1.2 kB', '5.6 GB')
    """
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError  # unreachable


# --- what is current --------------------------------------------------------------------------

def all_views(project: Project) -> list[TargetView]:
    return [v for t in project.targets for v in t.views()]


def referenced_wheels(project: Project) -> set[str]:
    """Every file any lock under ``images/`` pins (tools, common, every target's, every platform's)."""
    return {p.filename for lock in project.images_dir.rglob("*.lock") for p in lockfile.read_lock(lock)[1]}


def current_contexts(project: Project, views: Iterable[TargetView] | None = None) -> set[str]:
    """The names of the staged folders the current locks give (:func:`builder.wheels.contexts.context_folder`)."""

    return {contexts.context_folder(layers.context_layers(project, v)).name
            for v in (all_views(project) if views is None else views)}


# --- the files: wheelhouse and staged folders ------------------------------------------------

def _files(folder: Path) -> Iterator[Path]:
    for root, _, names in os.walk(folder):
        for name in names:
            yield Path(root) / name


def freed_bytes(paths: Iterable[Path]) -> int:
    """Bytes the file system gets back when every file of *paths* (files or folders) is deleted:
    an inode's size counts once, and only when every one of its hard links is among them."""
    seen: dict[tuple[int, int], list[int]] = {}
    for path in paths:
        for f in _files(path) if path.is_dir() else [path]:
            try:
                st = f.lstat()
            except OSError:
                continue
            entry = seen.setdefault((st.st_dev, st.st_ino), [st.st_size, st.st_nlink, 0])
            entry[2] += 1
    return sum(size for size, nlink, links in seen.values() if links >= nlink)


def _held(paths: Iterable[Path]) -> int:
    seen: dict[tuple[int, int], int] = {}
    for path in paths:
        for f in _files(path) if path.is_dir() else [path]:
            with contextlib.suppress(OSError):
                st = f.lstat()
                seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


@dataclass
class FileSelection:
    """What :func:`select_files` found: what goes, what a live build keeps, what is not the builder's."""

    folders: list[Path] = field(default_factory=list)  # staged folders that go
    wheels: list[Path] = field(default_factory=list)  # wheels that go
    held: list[Path] = field(default_factory=list)  # staged folders that would go, but a live build holds them
    foreign: list[Path] = field(default_factory=list)  # files and folders the builder did not record: never touched


def select_files(house: Path, records: dict[str, Record], wanted_wheels: set[str], wanted_contexts: set[str],
                 clone: str | None, keep_days: float, now: float | None = None) -> FileSelection:
    """What goes from *house*: the staged folders and the wheels its ledger *records* as the builder's
    that this checkout (*clone*) does not want, no live run holds and no other clone used within
    *keep_days*; a wheel hard-linked from a kept folder stays (another clone stages it).

    Example:
        >>> select_files(Path("/nonexistent"), {}, set(), set(), "/src/project", 7)
        FileSelection(folders=[], wheels=[], held=[], foreign=[])
    """
    now = time.time() if now is None else now
    found = FileSelection()
    folders = _entries(house / wheelhouse.CONTEXTS, Path.is_dir)
    for path in folders:
        record = records.get(wheelhouse.context_key(path))
        if record is None or path.is_symlink():
            found.foreign.append(path)
        elif path.name not in wanted_contexts and not record.used_by_others(clone, keep_days, now):
            (found.held if record.held() else found.folders).append(path)
    linked = _linked(p for p in folders if p not in set(found.folders))
    for path in _entries(house, Path.is_file):
        record = records.get(path.name)
        if record is None or not wheelhouse.fetched(record, path):
            found.foreign.append(path)
            continue
        st = path.lstat()
        if path.name not in wanted_wheels and (st.st_dev, st.st_ino) not in linked and record.removable(
                clone, keep_days, now):
            found.wheels.append(path)
    return found


def _entries(folder: Path, kind: Callable[[Path], bool]) -> list[Path]:
    """*folder*'s entries of a *kind* (``Path.is_dir``, ``Path.is_file``), hidden ones left out, sorted;
    none if there is no such folder."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if kind(p) and not p.name.startswith("."))


def _linked(folders: Iterable[Path]) -> set[tuple[int, int]]:
    """(device, inode) of each file in *folders* that has another link."""
    return {(st.st_dev, st.st_ino) for p in folders for f in _files(p) if (st := f.lstat()).st_nlink > 1}


# --- the engine: build cache and images (builder.gc.owned records what is the builder's) ------

def _unique(image: ImageFacts) -> int:
    """An image's bytes no other image shares, as ``docker system df`` says (Size less SharedSize).

    An upper bound: Docker 26's containerd store reports no shared size for some images (untagged
    ones), whose layers other images (and BuildKit's cache) may still hold."""
    return image.size - image.shared_size


def digest_references(project: Project, records: Mapping[str, Record]) -> dict[str, str]:
    """The files naming an image by digest (:func:`builder.gc.owned.digest_references`): this
    checkout's, those of every clone the *records* name, and the launcher scripts the builder wrote."""
    roots = {project.root, *(Path(c) for r in records.values() for c in r.clones)}
    return owned.digest_references(sorted(roots), owned.recorded_scripts())


# --- collect and remove -----------------------------------------------------------------------

def collect(engine: Engine | None, project: Project, keep_days: float = KEEP_DAYS,
            items: bool = True, current: AbstractSet[str] | None = None) -> Found:
    """What each store holds, and (with *items*) what goes; nothing is removed. Without an *engine*
    the engine's stores are left out. *current*: every tag this checkout's views give an image now
    (:func:`builder.images.content.current_refs`, which the caller hands in: the clean-up never
    renders); needed for the images to go, so with an *engine* and *items*."""
    if engine is not None and items and current is None:
        raise TypeError("collect: the images that go are decided against the current tags: pass current=")
    found = Found(keep_days=keep_days, current=frozenset(current or ()))
    _collect_files(found, project, keep_days, items)
    if engine is not None:
        _collect_engine(found, engine, project, keep_days, items)
    folder = localregistry.own_folder(project.matrix.registry)
    if folder is not None:
        found.where["registry"] = str(folder / "data")
        found.held["registry"] = _held([folder / "data"]) if (folder / "data").is_dir() else 0
        if items:
            found.items += [Item("registry", digest, size) for digest, size in localregistry.unreferenced_blobs(folder)]
    return found


def _collect_files(found: Found, project: Project, keep_days: float, items: bool) -> None:
    """The wheelhouse and the staged folders: what they hold, and (with *items*) what goes, what a live
    build keeps, and how many files and folders there are not the builder's (said once per store)."""
    house = wheelhouse.location()
    staged = house / wheelhouse.CONTEXTS
    found.where |= {"wheelhouse": str(house), "contexts": str(staged)}
    found.held["wheelhouse"] = _held(p for p in house.iterdir() if p.is_file() and not p.name.startswith("."))
    found.held["contexts"] = freed_bytes([staged]) if staged.is_dir() else 0  # not linked from the wheelhouse
    if items:
        chosen = select_files(house, wheelhouse.records(), referenced_wheels(project), current_contexts(project),
                              clone_id(project.root), keep_days)
        found.items += [Item("contexts", str(p), freed_bytes([p])) for p in chosen.folders]
        found.items += [Item("wheelhouse", p.name, freed_bytes([p])) for p in chosen.wheels]
        # A wheel and the folders linking it go together: their shared bytes are freed by both.
        shared = freed_bytes([*chosen.folders, *chosen.wheels]) - sum(i.bytes for i in found.items)
        if shared > 0:
            found.items.append(Item("wheelhouse", "(wheels linked from the folders above)", shared))
        found.kept += [Item("contexts", str(p), 0, "a live build holds it") for p in chosen.held]
        files = [p for p in chosen.foreign if p.parent == house]
        folders = [p for p in chosen.foreign if p.parent == staged]
        if files:
            found.kept.append(Item("wheelhouse", str(house), 0,
                                   f"{len(files)} files the builder did not fetch: never touched"))
        if folders:
            found.kept.append(Item("contexts", str(staged), 0,
                                   f"{len(folders)} folders the builder did not stage: never touched"))


def _collect_engine(found: Found, engine: Engine, project: Project, keep_days: float, items: bool) -> None:
    """The engine's build cache and the images the builder recorded: what they hold, and (with
    *items*) what goes (:mod:`builder.gc.owned` decides)."""
    usage = engine.disk_usage()
    cache = usage.build_cache
    found.held["build cache"] = sum(r.size for r in cache if not r.shared)
    ledger = owned.images_ledger(engine)
    records = ledger.records()
    images = [i for i in usage.images if i.id in records]
    found.held["images"] = sum(_unique(i) for i in images)
    found.where["images"] = f"recorded in {ledger.path}"
    if not items:
        return
    clone = clone_id(project.root)
    stale = owned.stale_wheel_sources(cache, owned.build_cache_ledger(engine).records(), clone=clone,
                                      keep_days=keep_days)
    found.items += [Item("build cache", r.id, r.size, r.description) for r in stale]
    for v in owned.image_verdicts(images, records, clone=clone, keep_days=keep_days, current=found.current,
                                  references=digest_references(project, records)):
        named = ", ".join(v.untag) or "untagged"
        if v.kept is not None:
            found.kept.append(Item("images", v.id, 0, f"{', '.join(sorted(owned.tags_of(v.image))) or 'untagged'}: "
                                                      f"{v.kept}"))
        elif v.remove:
            found.items.append(Item("images", v.id, _unique(v.image), f"{named}, target {records[v.id].facts.get('target')}"))
        else:
            found.items.append(Item("images", v.id, 0, f"{named} untagged only: other tags keep the image"))


def remove(engine: Engine | None, project: Project, found: Found,
           say: Callable[[str], None] = lambda line: None) -> list[Item]:
    """Remove *found*'s items; return those that could not be removed (with why, in ``note``)."""
    _remove_files(project, found)
    failed = _remove_from_engine(engine, project, found) if engine is not None else []
    if engine is not None:
        forget_gone(engine, found.started)
    for item in failed:
        say(f"{item.store}: {item.name} not removed: {item.note}")
    folder = localregistry.own_folder(project.matrix.registry)
    blobs = [i for i in found.items if i.store == "registry"]
    if folder is not None and blobs and (why := localregistry.collect_garbage(folder)) is not None:
        say(f"registry: {len(blobs)} unreferenced blobs left in {folder / 'data'}: {why}")
        failed += [Item("registry", i.name, 0, why) for i in blobs]
    return failed


def _remove_files(project: Project, found: Found) -> None:
    """Remove *found*'s staged folders and wheels that still go."""
    house = wheelhouse.location()
    with locked(wheelhouse.lock_path()):
        # Decided again under the lock: a build may have staged (linked, held) since collect looked.
        chosen = select_files(house, wheelhouse.records(), referenced_wheels(project), current_contexts(project),
                              clone_id(project.root), 0)
        listed = {i.name for i in found.items if i.store in ("contexts", "wheelhouse")}
        for path in chosen.folders:
            if str(path) in listed:
                contexts.remove_context(path)  # keeps the stamps of the wheels it linked current
        wheelhouse.remove_wheels(p.name for p in chosen.wheels if p.name in listed)


def _remove_from_engine(engine: Engine, project: Project, found: Found) -> list[Item]:
    """Remove *found*'s build cache records and images; return those the engine kept, with why."""
    failed: list[Item] = []
    clone = clone_id(project.root)
    with owned.build_cache_ledger(engine).editing() as copies:
        for rid in (i.name for i in found.items if i.store == "build cache"):
            if rid not in copies or copies[rid].used_by_others(clone, found.keep_days):
                continue  # another clone's build used it since collect looked
            if (why := engine.prune_build_cache(rid)) is not None:  # BuildKit never prunes one in use
                failed.append(Item("build cache", rid, 0, why))
            else:
                copies.pop(rid)
    current, listed = found.current, [i.name for i in found.items if i.store == "images"]
    with owned.images_ledger(engine).editing() as records:
        # Decided again under the ledger's lock: since collect looked, a build may hold the image now,
        # or another clone have used it (their records wait for this lock).
        building = owned.building_targets(records)
        for image_id in listed:
            image, record = engine.image(image_id), records.get(image_id)
            if image is None or record is None:
                continue
            v = owned.verdict(image, record, clone=clone, keep_days=found.keep_days, current=current,
                              building=building, references={})
            if v is None or v.kept is not None:
                failed.append(Item("images", image_id, 0, f"kept: {v.kept if v else 'current again'}"))
                continue
            if (why := _remove_image(engine, v)) is not None:
                failed.append(Item("images", image_id, 0, why))
            elif v.remove:
                records.pop(image_id, None)
    return failed


def _remove_image(engine: Engine, v: owned.Verdict) -> str | None:
    """Untag the builder's tags of the image, then (with ``remove``) the image itself if still there."""
    for tag in v.untag:
        if (why := engine.remove_image(tag)) is not None:  # a container uses it (conflict): kept
            return why
    if v.remove and engine.image(v.id) is not None:
        return engine.remove_image(v.id)
    return None


def forget_gone(engine: Engine, since: float) -> None:
    """Forget the records of images and build-cache records the engine no longer has (removed by
    hand, or by BuildKit's own bound), recorded and used before *since* (a build recording one now
    keeps its record), and those of launcher scripts that are gone."""
    scripts = Ledger(REFERENCES)
    scripts.forget([p for p in scripts.records() if not Path(p).is_file()])
    usage = engine.disk_usage()
    owned.forget_absent(owned.images_ledger(engine), {i.id for i in usage.images}, since)
    owned.forget_absent(owned.build_cache_ledger(engine), {r.id for r in usage.build_cache}, since)


def current_context_images(project: Project, views: Iterable[TargetView] | None = None) -> set[str]:
    """The names of the wheel contexts' images the current locks give (:func:`builder.wheels.images.refs`)."""
    return {ref for v in (all_views(project) if views is None else views)
            for ref in images.refs(layers.context_layers(project, v), v.platform).values()}


def remove_stale_context_images(engine: Engine, project: Project, current: AbstractSet[str],
                                keep_days: float) -> list[str]:
    """Remove the wheel contexts' images the builder recorded that carry none of the *current* names,
    by the images' rules (:func:`builder.gc.owned.verdict`: never one a live build holds, one another
    clone used within *keep_days*, one a container uses); their IDs."""
    records = owned.images_ledger(engine).records()
    served = {i: r for i, r in records.items()
              if any(t.startswith(contextimages.REPOSITORY + "/") for t in r.facts.get("tags", ()))}
    # One recorded under a current name stays whatever the engine says: only the others are asked
    # for (an inspection each, ~10 ms, after every build).
    found = [f for i, r in served.items() if current.isdisjoint(r.facts.get("tags", ()))
             and (f := engine.image(i)) is not None]
    gone = []
    for v in owned.image_verdicts(found, served, clone=clone_id(project.root), keep_days=keep_days,
                                  current=current, references={}):
        if v.remove and _remove_image(engine, v) is None:
            gone.append(v.id)
    return gone


def after_build(project: Project, engine: Engine | None = None, keep_days: float = 1.0) -> None:
    """What ``builder build`` cleans itself after building: the engine is done with the folders this
    run staged, so it holds them no more; then the staged folders the builder recorded that no current
    view of this checkout names, no live build holds and no other clone used for *keep_days* go, and
    so do the wheel contexts' images on *engine* by the same rule (:func:`remove_stale_context_images`).
    Best effort: never fails a build."""
    with contextlib.suppress(Exception):  # a cleanup; the build itself has its outcome already
        wheelhouse.release()
        house = wheelhouse.location()
        with locked(wheelhouse.lock_path()):
            chosen = select_files(house, wheelhouse.records(), set(), current_contexts(project),
                                  clone_id(project.root), keep_days)
            for path in chosen.folders:
                contexts.remove_context(path)
        if engine is not None:
            remove_stale_context_images(engine, project, current_context_images(project), keep_days)


def report_lines(found: Found, verbose: bool, dry_run: bool) -> list[str]:
    """One line per store (held, and what goes); with *verbose*, a line per item below its store."""
    verb = "would free" if dry_run else "freed"
    lines = []
    for s in found.summary():
        where = f" ({s.where})" if s.where else ""
        bound = " at most" if s.store == "images" and s.items else ""  # docker's unique sizes: see _unique
        lines.append(f"{s.store}: holds {human(s.held)}{where}; {verb}{bound} {human(s.freed)} ({s.items} items)")
        if verbose:
            lines += [f"  {i.name}  {human(i.bytes)}{'  ' + i.note if i.note else ''}"
                      for i in found.items if i.store == s.store]
    lines += [f"kept {i.store}: {i.name}: {i.note}" for i in found.kept]
    return lines


def as_json(found: Found, dry_run: bool) -> str:
    return json.dumps({"dry_run": dry_run, **found.as_dict()}, indent=2)
