"""``builder gc``: what the builder's stores hold, and removing what no current lock or target references.

Five stores (:func:`collect` finds what goes, :func:`remove` removes it):

- **wheelhouse** (:func:`builder.images.wheelhouse.location`): a wheel the builder fetched (its
  ledger records it: :mod:`builder.images.wheelhouse`) that no lock under ``images/`` of this
  checkout pins, no live build holds and no other clone used within ``keep_days`` (the wheelhouse is
  shared by every clone of the user, and beyond); one hard-linked from a staged folder that is kept
  stays too. A file the builder did not fetch (a note, another project's wheel) is never touched:
  the report says how many there are, once.
- **contexts** (``<wheelhouse>/.contexts/<hash>``): a folder the builder staged (recorded) that is
  no current target view's :func:`~builder.images.wheelhouse.context_folder`, that no live build
  holds (a build holds what it staged until the engine is done with it) and no other clone used
  within ``keep_days``.
- **build cache**: BuildKit's copies of the wheel contexts (``local source for wheels-<layer>``):
  BuildKit keeps one copy per context name and syncs it in place; any older record of the same
  name is a leftover (a concurrent build's, or an older one's). Pruned through ``docker buildx
  prune --filter id=...``, never by touching the engine's files; records in use are never pruned.
- **images**: local tags ``<registry>:<target>-<12 hex>`` of this project's repository (content
  tags) that no current target view's content tag names, and untagged images labelled with one of
  its targets (``io.ml-image-builder.target``: left when a tag moved on); an image a container uses
  is kept.
- **registry**: blobs of the loopback registry (:mod:`builder.oci.localregistry`) no manifest
  references: ``docker-registry garbage-collect``, with that registry stopped (its docs ask it
  read-only or stopped) and started again when it was running.

Deleting from the wheelhouse happens under its lock, decided again there, so a concurrent build
never loses a file it is staging.

Example:
    >>> found = collect(connect(), project, keep_days=7)  # doctest: +SKIP
    >>> [f"{s.store}: {human(s.freed)}" for s in found.summary()]  # doctest: +SKIP
    ['wheelhouse: 1.2 GB', 'contexts: 0 B', 'build cache: 310 MB', 'images: 40 MB', 'registry: 0 B']
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from builder.config.files import locked
from builder.config.ownership import Record, clone_id
from builder.config.project import LABEL_PREFIX, Project, TargetView
from builder.config.state import state_dir
from builder.images import layers, lockfile, wheelhouse
from builder.images.content import content_tags
from builder.oci import registry
from builder.oci.engine import Engine
from builder.oci.localregistry import ensure_local
from builder.oci.secrets import PLAIN, child_env

STORES = ("wheelhouse", "contexts", "build cache", "images", "registry")
#: Default of ``--keep-days``: another clone that builds weekly keeps its wheels.
KEEP_DAYS = 7
#: BuildKit's description of a wheel context's copy (:func:`builder.images.layers.context_name`).
WHEEL_SOURCE = "local source for wheels-"
TARGET_LABEL = f"{LABEL_PREFIX}.target"


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
    """The names of the staged folders the current locks give (:func:`wheelhouse.context_folder`)."""

    return {wheelhouse.context_folder(layers.context_layers(project, v)).name
            for v in (all_views(project) if views is None else views)}


def current_tags(project: Project) -> set[str]:

    return set(content_tags(project, all_views(project)).values())


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


# --- the engine: build cache and content tags -------------------------------------------------

def stale_build_cache(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """BuildKit's copies of wheel contexts that a newer copy of the same name superseded (never one in use).

    Example:
        >>> recs = [{"ID": "a", "Type": "source.local", "Description": "local source for wheels-torch",
        ...          "LastUsedAt": "2026-01-02T00:00:00Z", "InUse": False, "Size": 9},
        ...         {"ID": "b", "Type": "source.local", "Description": "local source for wheels-torch",
        ...          "LastUsedAt": "2026-01-01T00:00:00Z", "InUse": False, "Size": 8}]
        >>> [r["ID"] for r in stale_build_cache(recs)]
        ['b']
    """
    newest: dict[str, dict[str, Any]] = {}
    wheel_sources = [r for r in records if r.get("Type") == "source.local"
                     and str(r.get("Description", "")).startswith(WHEEL_SOURCE)]
    for r in wheel_sources:
        name = r["Description"]
        if name not in newest or str(r.get("LastUsedAt") or "") > str(newest[name].get("LastUsedAt") or ""):
            newest[name] = r
    return [r for r in wheel_sources if r is not newest[r["Description"]] and not r.get("InUse")]


def project_repos(project: Project) -> list[str]:
    return sorted({v.primary_ref.rsplit(":", 1)[0] for v in all_views(project)})


def _unique(image: dict[str, Any]) -> int:
    """An image's bytes no other image shares, as ``docker system df`` says (Size less SharedSize).

    An upper bound: Docker 26's containerd store reports no shared size for some images (untagged
    ones), whose layers other images (and BuildKit's cache) may still hold."""
    return int(image.get("Size") or 0) - max(int(image.get("SharedSize") or 0), 0)


def dangling(images: Iterable[dict[str, Any]], targets: set[str]) -> list[dict[str, Any]]:
    """Untagged images a build of one of *targets* made (label ``io.ml-image-builder.target``), no container
    on them: what a tag that moved on left behind (a build without the smoke test has no content tag).

    Example:
        >>> imgs = [{"Id": "a", "RepoTags": [], "Labels": {"io.ml-image-builder.target": "cpu"}, "Containers": 0},
        ...         {"Id": "b", "RepoTags": ["r:t"], "Labels": {"io.ml-image-builder.target": "cpu"}, "Containers": 0},
        ...         {"Id": "c", "RepoTags": [], "Labels": {}, "Containers": 0}]
        >>> [i["Id"] for i in dangling(imgs, {"cpu"})]
        ['a']
    """
    return [i for i in images if not [t for t in i.get("RepoTags") or [] if t != "<none>:<none>"]
            and (i.get("Labels") or {}).get(TARGET_LABEL) in targets and int(i.get("Containers") or 0) <= 0]


def content_tag_pattern(project: Project) -> re.Pattern[str]:
    """The local tags that are content tags of this project: its repositories, its targets' names."""
    repos = project_repos(project)
    names = sorted({t.name for t in project.targets}, key=len, reverse=True)
    return re.compile(f"({'|'.join(map(re.escape, repos))}):({'|'.join(map(re.escape, names))})-[0-9a-f]{{12}}")


def stale_tags(images: Iterable[dict[str, Any]], pattern: re.Pattern[str], current: set[str]) -> list[tuple[str, dict[str, Any]]]:
    """(tag, image) of each content tag of this project that no current view has; others' images never.

    Example:
        >>> pat = re.compile(r"(r/p):(cpu)-[0-9a-f]{12}")
        >>> imgs = [{"RepoTags": ["r/p:cpu-0123456789ab", "r/p:latest-cpu"]}, {"RepoTags": ["r/p:cpu-aaaaaaaaaaaa"]},
        ...         {"RepoTags": ["other/x:cpu-0123456789ab"]}]
        >>> [t for t, _ in stale_tags(imgs, pat, {"r/p:cpu-aaaaaaaaaaaa"})]
        ['r/p:cpu-0123456789ab']
    """
    return [(tag, image) for image in images for tag in image.get("RepoTags") or []
            if pattern.fullmatch(tag) and tag not in current]


# --- the local registry -----------------------------------------------------------------------

def registry_folder(project: Project) -> Path | None:
    """The loopback registry's folder (:func:`builder.oci.localregistry.ensure_local`), if the matrix uses one."""
    host = registry.Ref.parse(project.matrix.registry).host
    if not registry.is_local(host):
        return None
    port = host.rsplit(":", 1)[-1] if ":" in host else "80"
    folder = state_dir() / f"registry-{port}"
    return folder if (folder / "config.yml").is_file() else None


def _registry_binary() -> str | None:
    return shutil.which("docker-registry")


def registry_garbage(folder: Path) -> list[Item]:
    """``garbage-collect --dry-run``: the blobs no manifest references, with their sizes."""
    binary = _registry_binary()
    if binary is None:
        return []
    proc = subprocess.run([binary, "garbage-collect", "--dry-run", str(folder / "config.yml")],
                          capture_output=True, text=True, check=False, env=child_env(PLAIN))
    blobs = folder / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256"
    items = []
    for digest in sorted(set(re.findall(r"blob eligible for deletion: (sha256:[0-9a-f]{64})", proc.stdout + proc.stderr))):
        data = blobs / digest[7:9] / digest[7:] / "data"
        items.append(Item("registry", digest, data.stat().st_size if data.is_file() else 0))
    return items


def _registry_pid(folder: Path) -> int | None:
    """The pid of the registry :mod:`builder.oci.localregistry` started on this folder, if it runs."""
    try:
        pid = int((folder / "registry.pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if str(folder / "config.yml").encode() in cmdline else None


def collect_registry(folder: Path) -> None:
    """Stop the loopback registry (garbage-collect wants it stopped), collect, start it again if it ran."""
    binary = _registry_binary()
    if binary is None:
        return
    pid = _registry_pid(folder)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):
            if not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                break
            time.sleep(0.1)
    try:
        subprocess.run([binary, "garbage-collect", str(folder / "config.yml")], capture_output=True, check=True,
                       env=child_env(PLAIN))
    finally:
        if pid is not None:
            config = (folder / "config.yml").read_text()
            addr = re.search(r"addr: '([^']+)'", config)
            if addr:
                ensure_local(addr.group(1).replace("127.0.0.1", "localhost"))


# --- collect and remove -----------------------------------------------------------------------

def collect(engine: Engine | None, project: Project, keep_days: float = KEEP_DAYS,
            items: bool = True) -> Found:
    """What each store holds, and (with *items*) what goes; nothing is removed. Without an *engine*
    the engine's stores are left out."""
    found = Found()
    _collect_files(found, project, keep_days, items)
    if engine is not None:
        _collect_engine(found, engine, project, items)
    folder = registry_folder(project)
    if folder is not None:
        found.where["registry"] = str(folder / "data")
        found.held["registry"] = _held([folder / "data"]) if (folder / "data").is_dir() else 0
        if items:
            found.items += registry_garbage(folder)
    return found


def _collect_files(found: Found, project: Project, keep_days: float, items: bool) -> None:
    """The wheelhouse and the staged folders: what they hold, and (with *items*) what goes, what a live
    build keeps, and how many files and folders there are not the builder's (said once per store)."""
    house = wheelhouse.location()
    contexts = house / wheelhouse.CONTEXTS
    found.where |= {"wheelhouse": str(house), "contexts": str(contexts)}
    found.held["wheelhouse"] = _held(p for p in house.iterdir() if p.is_file() and not p.name.startswith("."))
    found.held["contexts"] = freed_bytes([contexts]) if contexts.is_dir() else 0  # not linked from the wheelhouse
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
        folders = [p for p in chosen.foreign if p.parent == contexts]
        if files:
            found.kept.append(Item("wheelhouse", str(house), 0,
                                   f"{len(files)} files the builder did not fetch: never touched"))
        if folders:
            found.kept.append(Item("contexts", str(contexts), 0,
                                   f"{len(folders)} folders the builder did not stage: never touched"))


def _collect_engine(found: Found, engine: Engine, project: Project, items: bool) -> None:
    """The engine's build cache and this project's images: what they hold, and (with *items*) what goes."""
    usage = engine.disk_usage()
    records = usage.get("BuildCache") or []
    found.held["build cache"] = sum(int(r.get("Size") or 0) for r in records if not r.get("Shared"))
    pattern = content_tag_pattern(project)
    ours = [i for i in usage.get("Images") or [] if any(pattern.fullmatch(t) for t in i.get("RepoTags") or [])]
    untagged = dangling(usage.get("Images") or [], {t.name for t in project.targets})
    found.held["images"] = sum(_unique(i) for i in [*ours, *untagged])
    found.where["images"] = ", ".join(project_repos(project))
    if items:
        found.items += [Item("build cache", r["ID"], int(r.get("Size") or 0), r.get("Description", ""))
                        for r in stale_build_cache(records)]
        _image_items(found, stale_tags(ours, pattern, current_tags(project)), untagged)


def _image_items(found: Found, stale: list[tuple[str, dict[str, Any]]],
                 untagged: list[dict[str, Any]]) -> None:
    """The *stale* content tags go (an image with them, when its last tag), unless a container uses it; the
    targets' *untagged* images go."""
    for tag, image in stale:
        last = len(image.get("RepoTags") or []) == 1  # untagging the last tag deletes the image
        if last and int(image.get("Containers") or 0) > 0:
            found.kept.append(Item("images", tag, 0, "a container uses it"))
        else:
            found.items.append(Item("images", tag, _unique(image) if last else 0,
                                    "" if last else "untagged only: other tags keep the image"))
    found.items += [Item("images", i["Id"], _unique(i), f"untagged, target {i['Labels'][TARGET_LABEL]}")
                    for i in untagged]


def remove(engine: Engine | None, project: Project, found: Found,
           say: Callable[[str], None] = lambda line: None) -> list[Item]:
    """Remove *found*'s items; return those that could not be removed (with why, in ``note``)."""
    _remove_files(project, found)
    failed = _remove_from_engine(engine, found) if engine is not None else []
    folder = registry_folder(project)
    if folder is not None and any(i.store == "registry" for i in found.items):
        collect_registry(folder)
    for item in failed:
        say(f"{item.store}: {item.name} not removed: {item.note}")
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
                wheelhouse.remove_context(path)  # keeps the stamps of the wheels it linked current
        wheelhouse.remove_wheels(p.name for p in chosen.wheels if p.name in listed)


def _remove_from_engine(engine: Engine, found: Found) -> list[Item]:
    """Remove *found*'s build cache records and images; return those the engine kept, with why."""
    failed: list[Item] = []
    for record in (i.name for i in found.items if i.store == "build cache"):
        if (why := engine.prune_build_cache(record)) is not None:
            failed.append(Item("build cache", record, 0, why))
    for item in (i for i in found.items if i.store == "images"):
        if (why := engine.remove_image(item.name)) is not None:  # a container uses it (conflict): kept
            failed.append(Item("images", item.name, 0, why))
    return failed


def after_build(project: Project, keep_days: float = 1.0) -> None:
    """What ``builder build`` cleans itself after building: the engine is done with the folders this
    run staged, so it holds them no more; then the staged folders the builder recorded that no current
    view of this checkout names, no live build holds and no other clone used for *keep_days* go.
    Best effort: never fails a build."""
    with contextlib.suppress(Exception):  # a cleanup; the build itself has its outcome already
        wheelhouse.release()
        house = wheelhouse.location()
        with locked(wheelhouse.lock_path()):
            chosen = select_files(house, wheelhouse.records(), set(), current_contexts(project),
                                  clone_id(project.root), keep_days)
            for path in chosen.folders:
                wheelhouse.remove_context(path)


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
