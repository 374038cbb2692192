"""What of an engine's stores is the builder's own: the images and the build-cache records its builds
made, by ledgers it writes itself (:class:`builder.config.ownership.Ledger`, one per engine), never
by a name, a label or an age; and what ``builder gc`` may remove of them.

- **Images** (ledger ``images-<engine>``, keyed by image ID): an image a build made is recorded as
  soon as the engine has it, held by the build's run (its lease, :func:`~builder.config.ownership.run_token`)
  until its stages end (smoke-tested, tagged, pushed); an image a build pulled (``--pull``) or
  reused (its content tag was there: how images built before the ledger are adopted) is recorded
  too. Each record names its target, the tags the builder gave it and, per clone, when that clone
  used it last. While a view builds, its run also holds ``build:<target>``: no image of that
  target goes then (the image a build is exporting may be one recorded earlier, by its ID).
- **Build cache** (ledger ``build-cache-<engine>``, keyed by BuildKit's record ID): BuildKit's
  copies of the wheel contexts (``local source for wheels-<layer>``). Every clone's and every
  user's builds share those descriptions, so a copy is ours when it appeared, or its use moved,
  during one of our builds, recorded with that clone's time of use.
- **Digest references** (:func:`digest_references`): the files that name an image by digest, whose
  image stays: each clone's ``dist/published.json`` and ``base.lock.json``, and the launcher
  scripts ``builder slurm`` wrote (:data:`builder.config.ownership.REFERENCES`).

:func:`image_verdicts` and :func:`stale_wheel_sources` decide (pure); :mod:`builder.gc.stores` lists
and removes, deciding again under the ledger's lock.

Example:
    >>> sorted(images_ledger(connect()).records())[:1]  # doctest: +SKIP
    ['sha256:6f2c...']
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.config.files import published_path
from builder.config.ownership import REFERENCES, Ledger, Record, clone_id
from builder.config.project import Project
from builder.config.state import state_dir
from builder.oci.engine import CacheRecord, Engine, ImageFacts

#: BuildKit's description of a wheel context's copy (:func:`builder.wheels.layers.context_name`).
WHEEL_SOURCE = "local source for wheels-"
#: The key of a build's hold on its target: while a live run holds it, no image of the target goes.
BUILDING = "build:"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
DAY = 86400.0


def engine_key(engine: Engine) -> str:
    """The engine a ledger is about (its kind and :meth:`~builder.oci.engine.Engine.store_key`), in 16
    hex: an image ID means nothing on another engine."""
    return hashlib.sha256(f"{engine.name()} {engine.store_key()}".encode()).hexdigest()[:16]


def images_ledger(engine: Engine) -> Ledger:
    return Ledger("images", state_dir() / "owned" / f"images-{engine_key(engine)}.json")


def build_cache_ledger(engine: Engine) -> Ledger:
    return Ledger("build cache", state_dir() / "owned" / f"build-cache-{engine_key(engine)}.json")


# --- what a build records ---------------------------------------------------------------------

@contextlib.contextmanager
def building(engine: Engine, target: str) -> Iterator[None]:
    """This run holds ``build:<target>`` for the block: ``builder gc`` removes no image of *target* meanwhile."""
    ledger, key = images_ledger(engine), BUILDING + target
    ledger.record(key, hold=True)
    try:
        yield
    finally:
        ledger.release([key])


def record_image(engine: Engine, project: Project, image_id: str, target: str, tags: Iterable[str] = (),
                 *, hold: bool = False) -> None:
    """Record *image_id* as the builder's: of *target*, given *tags*, used now by this clone, held by
    this run with *hold* (until :func:`release_image`)."""
    ledger = images_ledger(engine)
    ledger.record(image_id, clone=clone_id(project.root), hold=hold, facts={"target": target})
    if tags := set(tags):
        with ledger.editing() as records:
            if image_id in records:
                facts = records[image_id].facts
                facts["tags"] = sorted({*facts.get("tags", []), *tags})


def release_image(engine: Engine, image_id: str) -> None:
    images_ledger(engine).release([image_id])


def _is_wheel_source(record: CacheRecord) -> bool:
    return record.type == "source.local" and record.description.startswith(WHEEL_SOURCE)


def _copies(cache: Iterable[CacheRecord], contexts: Iterable[str]) -> dict[str, CacheRecord]:
    """{record ID: record} of BuildKit's copies of the named *contexts* (``wheels-<layer>``) in *cache*."""
    wanted = {f"local source for {name}" for name in contexts}
    return {r.id: r for r in cache if r.type == "source.local" and r.description in wanted}


def _use(record: CacheRecord) -> tuple[str | None, int]:
    return record.last_used, record.usage_count


def wheel_sources(engine: Engine, contexts: Iterable[str]) -> dict[str, tuple[str | None, int]]:
    """{record ID: (last used, use count)} of BuildKit's copies of the named *contexts*: taken before
    a build, for :func:`record_wheel_sources` after it."""
    return {rid: _use(r) for rid, r in _copies(engine.build_cache(), contexts).items()}


def forget_absent(ledger: Ledger, present: AbstractSet[str], since: float) -> None:
    """Forget the records in *ledger* of what the engine no longer has (*present*: what it has),
    recorded and last used before *since* (a run recording one now keeps its record); a live run's
    hold on a target (``build:<target>``, no engine object) stays. Writes only when one goes."""
    def gone(key: str, record: Record) -> bool:
        return key not in present and record.last_used() < since and not (key.startswith(BUILDING) and record.held())

    if any(gone(k, r) for k, r in ledger.records().items()):
        with ledger.editing() as records:
            for key in [k for k, r in records.items() if gone(k, r)]:
                records.pop(key)


def record_wheel_sources(engine: Engine, project: Project, contexts: Iterable[str],
                         before: Mapping[str, tuple[str | None, int]], since: float) -> list[str]:
    """Record the copies of the named *contexts* this clone's build made or used: those absent *before*
    it, or whose use moved during it; return their IDs. From the same listing, forget the records of
    copies the engine no longer has (BuildKit's GC, a prune) that were last used before *since* (the
    build's start): the ledger stays the size of what the engine holds, not only after ``builder gc``.

    BuildKit keeps a couple of copies of each context name per user and syncs them in place, and
    clones share them (seen here: clones in folders of one name, whatever their paths); a build
    that had to wait for a copy in use makes new ones. Another user's build of the same context at
    the same moment moves its copy too, which is then recorded as well: gc never prunes a copy in
    use, and pruning one costs its owner one full send of those wheels, nothing else."""
    cache = engine.build_cache()
    used = {rid: {"description": r.description} for rid, r in _copies(cache, contexts).items()
            if before.get(rid) != _use(r)}
    ledger = build_cache_ledger(engine)
    forget_absent(ledger, {r.id for r in cache}, since)
    if used:  # one call: the copies one build used share their time of use (stale_wheel_sources)
        ledger.record_many(used, clone=clone_id(project.root), facts=used)
    return sorted(used)


# --- what a clean-up may remove ---------------------------------------------------------------

def digest_references(roots: Iterable[Path], scripts: Iterable[Path] = ()) -> dict[str, str]:
    """{digest: the file naming it} for every ``sha256:`` digest in each clone's (*roots*')
    ``dist/published.json`` and ``base.lock.json``, and in each launcher script.

    Example:
        >>> digest_references([Path("/nonexistent")])
        {}
    """
    found: dict[str, str] = {}
    files = [f for root in roots for f in (published_path(root), root / "base.lock.json")]
    for path in [*files, *scripts]:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            for digest in DIGEST.findall(path.read_text(encoding="utf-8")):
                found.setdefault(digest, str(path))
    return found


def recorded_scripts() -> list[Path]:
    """The launcher scripts the builder wrote (``builder slurm``) that are still there."""
    return [Path(p) for p in Ledger(REFERENCES).records() if Path(p).is_file()]


def image_digests(image: ImageFacts) -> set[str]:
    """The digests an image is known by: its ID, and each ``repo@sha256:...`` of it."""
    return {image.id, *(n.rpartition("@")[2] for n in (*image.digests, *image.tags) if "@" in n)}


def tags_of(image: ImageFacts) -> set[str]:
    """An image's tags: ``repo:tag`` names (the containerd store's listing also names an image pulled by
    digest ``repo@sha256:...`` there: that is no tag)."""
    return {t for t in image.tags if t != "<none>:<none>" and "@" not in t}


def building_targets(records: Mapping[str, Record]) -> set[str]:
    """The targets a live (or possibly live) run is building now."""
    return {key.removeprefix(BUILDING) for key, r in records.items() if key.startswith(BUILDING) and r.held()}


@dataclass(frozen=True)
class Verdict:
    """What becomes of one recorded image: *untag* (the builder's tags of it) and, with *remove*, the
    image itself; or *kept* and why (nothing happens)."""

    image: ImageFacts
    untag: tuple[str, ...] = ()
    remove: bool = False
    kept: str | None = None

    @property
    def id(self) -> str:
        return self.image.id


def verdict(image: ImageFacts, record: Record, *, clone: str, keep_days: float, current: AbstractSet[str],
            building: set[str], references: Mapping[str, str], now: float | None = None) -> Verdict | None:
    """What ``builder gc`` in *clone* does with a recorded image: None when it is current (one of its
    tags is one of this checkout's *current* tags) or nothing of it is the builder's to remove.

    Kept, in this order: a run that is (or may be) alive holds it; a build of its target is running;
    another clone used it within *keep_days*; a container uses it; a file names it by digest.

    Example:
        >>> rec = Record(facts={"target": "cpu", "tags": ["r:cpu-aa"]}, recorded=0, clones={"/a": 0})
        >>> img = ImageFacts("sha256:1", tags=("r:cpu-aa",))
        >>> verdict(img, rec, clone="/a", keep_days=7, current=set(), building=set(), references={}).remove
        True
        >>> verdict(img, rec, clone="/a", keep_days=7, current={"r:cpu-aa"}, building=set(), references={}) is None
        True
    """
    tags = tags_of(image)
    if tags & current:
        return None
    now = time.time() if now is None else now
    ours = tuple(sorted(tags & set(record.facts.get("tags") or ())))
    kept = _kept(image, record, clone=clone, keep_days=keep_days, building=building, references=references,
                 now=now)
    if kept is not None:
        return Verdict(image, kept=kept)
    if tags - set(ours):  # another name (not the builder's) keeps the image: only ours go
        return Verdict(image, untag=ours) if ours else None
    return Verdict(image, untag=ours, remove=True)


def _kept(image: ImageFacts, record: Record, *, clone: str, keep_days: float, building: set[str],
          references: Mapping[str, str], now: float) -> str | None:
    if record.held():
        return "a running build holds it"
    if record.facts.get("target") in building:
        return f"a build of {record.facts['target']} is running"
    since = now - keep_days * DAY
    others = {c: when for c, when in record.clones.items() if c != clone and when >= since}
    if others:
        other, when = max(others.items(), key=lambda item: item[1])
        return f"clone {other} used it {(now - when) / DAY:.1f} days ago (--keep-days {keep_days:g})"
    if image.containers > 0:
        return "a container uses it"
    for digest in sorted(image_digests(image)):
        if digest in references:
            return f"{references[digest]} names it by digest"
    return None


def image_verdicts(images: Iterable[ImageFacts], records: Mapping[str, Record], **how: Any) -> list[Verdict]:
    """:func:`verdict` of each of *images* that *records* holds (others are never the builder's)."""
    building = building_targets(records)
    return [v for image in images if (record := records.get(image.id)) is not None
            and (v := verdict(image, record, building=building, **how)) is not None]


def stale_wheel_sources(cache: Iterable[CacheRecord], records: Mapping[str, Record], *, clone: str,
                        keep_days: float, now: float | None = None) -> list[CacheRecord]:
    """The wheel-context copies (``docker system df``'s build-cache records) that go: recorded as ours,
    not in use, used by no other clone within *keep_days*, and not *clone*'s current copy: one it never
    used, or one its last build of that context name did not use (by the records' times of use, which
    one build's copies share; never BuildKit's own, which differ by milliseconds within one build).

    Example:
        >>> def rec(i): return CacheRecord(i, "source.local", "local source for wheels-torch")
        >>> mine = {"a": Record(clones={"/a": 9}), "b": Record(clones={"/a": 9}), "c": Record(clones={"/a": 5}),
        ...         "e": Record(clones={"/b": 86400}), "f": Record(clones={"/b": 7.5 * 86400})}
        >>> [r.id for r in stale_wheel_sources([rec(i) for i in "abcdef"], mine, clone="/a",
        ...                                       keep_days=1, now=8 * 86400)]
        ['c', 'e']
    """
    ours = [r for r in cache if _is_wheel_source(r) and r.id in records]
    last: dict[str, float] = {}
    for r in ours:
        if (when := records[r.id].clones.get(clone)) is not None:
            last[r.description] = max(last.get(r.description, when), when)
    def current(r: CacheRecord) -> bool:
        when = records[r.id].clones.get(clone)
        return when is not None and when >= last[r.description]
    return [r for r in ours if not r.in_use and not current(r)
            and not records[r.id].used_by_others(clone, keep_days, now)]
