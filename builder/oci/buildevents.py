"""BuildKit's progress events (``docker buildx build --progress=rawjson``), read: the JSON objects
(:func:`events`), the build's steps (:class:`Steps`), where its time went (:class:`Phases`) and its
steps' output, line by line (:class:`Lines`). :mod:`builder.oci.buildkit` runs the builds.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import IO, Any


def events(stream: IO[str]) -> Iterator[dict[str, Any]]:
    """The JSON objects of ``--progress=rawjson`` (pretty-printed, one after another); other lines pass as text."""
    decoder = json.JSONDecoder()
    buffer = ""
    for line in stream:
        buffer += line
        text = buffer.lstrip()
        if not text:
            buffer = ""
            continue
        if not text.startswith("{"):  # a plain message from buildx itself (an error, a warning)
            yield {"text": text.rstrip()}
            buffer = ""
            continue
        try:
            event, _ = decoder.raw_decode(text)
        except json.JSONDecodeError:
            continue  # the object goes on in the next lines
        buffer = ""
        yield event


#: A Dockerfile step's vertex: ``[stage n/m] INSTRUCTION ...`` (``[internal]``, ``[context x]`` and
#: ``[auth]`` vertices are BuildKit's own work, no step).
STEP = re.compile(r"^\[[^\]]* \d+/\d+\] (?!FROM )")
#: BuildKit's vertex for reading a registry cache (``--cache-from type=registry,ref=REF``).
CACHE_IMPORT = re.compile(r"^importing cache manifest from (?P<ref>\S+)")


class Steps:
    """The build's steps from BuildKit's vertex events: the Dockerfile's own (FROM aside), done and cached.

    Keyed by the step's name (``[stage n/m] ...``): a step taken from a registry cache can show up
    as two vertices (the cache's and the solve's), which is still one step.
    """

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.done: set[str] = set()
        self.cached: set[str] = set()
        self.cache_read: dict[str, None] = {}

    def update(self, vertex: dict[str, Any]) -> str | None:
        """Record one vertex event; return the step's name when it just started."""
        name = vertex.get("name", "")
        if (imported := CACHE_IMPORT.match(name)) and vertex.get("completed") and not vertex.get("error"):
            self.cache_read[imported["ref"]] = None
        if not STEP.match(name):
            return None
        started = name not in self.names
        self.names.add(name)
        if vertex.get("cached"):
            self.cached.add(name)
        if vertex.get("completed"):
            self.done.add(name)
        return name if started else None


#: The phase of BuildKit's vertices by name: the Dockerfile's steps, the build contexts sent (the
#: project's and the wheels'), the base and cache lookups, the export (layers compressed, image
#: written or unpacked); anything else is "other".
PHASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("steps", STEP),
    ("context", re.compile(r"^\[(internal\] load (build context|\.dockerignore|build definition)|context )")),
    ("base and cache", re.compile(r"^(\[internal\] load metadata|\[auth\]|\[[^\]]* \d+/\d+\] FROM |importing cache)")),
    ("export", re.compile(r"^(exporting|writing image|naming to|unpacking to|sending tarball)")),
)

#: Two parts of the export, from BuildKit's statuses within it (counted in "export" too): every new
#: layer diffed and compressed (one status for them all), and the image unpacked into the containerd
#: store (the classic store has no such status: its layers are its snapshots already).
EXPORT_PARTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("export: layers", re.compile(r"^exporting layers")),
    ("export: unpack", re.compile(r"^unpacking to ")),
)


def _seconds(stamp: str) -> float:
    """An RFC 3339 time of BuildKit's (nanoseconds) as POSIX seconds."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(head).replace(tzinfo=UTC).timestamp() + float(f"0.{frac or 0}")


class Phases:
    """Where a build's time went, from BuildKit's vertex events: each vertex's started-to-completed
    seconds, summed per phase (:data:`PHASES`), and two parts of the export from its statuses
    (:data:`EXPORT_PARTS`). Vertices that ran side by side (the contexts, say) count each, so the
    phases can add up to more than the build's wall time."""

    def __init__(self) -> None:
        self.spans: dict[str, tuple[str, str | None, str | None]] = {}  # digest: (name, started, completed)
        self.parts: dict[str, tuple[str, str | None, str | None]] = {}  # vertex/status id: (part, started, completed)

    def update(self, vertex: dict[str, Any]) -> None:
        key = vertex.get("digest") or vertex.get("name", "")
        name, started, completed = self.spans.get(key, (vertex.get("name", ""), None, None))
        self.spans[key] = (name, started or vertex.get("started"), vertex.get("completed") or completed)

    def update_status(self, status: dict[str, Any]) -> None:
        """A status within a vertex (a transfer, a part of the export): only :data:`EXPORT_PARTS` are kept."""
        part = next((p for p, pattern in EXPORT_PARTS if pattern.match(status.get("id", ""))), None)
        if part is None:
            return
        key = f"{status.get('vertex', '')}/{status['id']}"
        _, started, completed = self.parts.get(key, (part, None, None))
        self.parts[key] = (part, started or status.get("started"), status.get("completed") or completed)

    def window(self, part: str) -> tuple[float, float] | None:
        """When *part* (one of :data:`EXPORT_PARTS`) first started and last ended, POSIX seconds; None if it never ended."""
        spans = [(_seconds(started), _seconds(completed)) for p, started, completed in self.parts.values()
                 if p == part and started and completed]
        return (min(s for s, _ in spans), max(e for _, e in spans)) if spans else None

    def seconds(self) -> dict[str, float]:
        out: dict[str, float] = {}
        spans = [(next((p for p, pattern in PHASES if pattern.match(name)), "other"), started, completed)
                 for name, started, completed in self.spans.values()]
        for phase, started, completed in spans + list(self.parts.values()):
            if started and completed:
                out[phase] = out.get(phase, 0.0) + max(0.0, _seconds(completed) - _seconds(started))
        return {k: round(v, 2) for k, v in out.items()}


class Lines:
    """A step's output, one line per line: BuildKit sends what each write wrote (uv writes a token at
    a time), so the text of a line is kept per step until its newline; escape codes are removed."""

    def __init__(self) -> None:
        self.pending: dict[str, str] = {}

    def feed(self, event: dict[str, Any]) -> Iterator[str]:
        for log in event.get("logs") or []:
            try:
                text = base64.b64decode(log.get("data", "")).decode("utf-8", "replace")
            except (ValueError, TypeError):
                continue
            key = f"{log.get('vertex', '')}/{log.get('stream', '')}"
            *done, self.pending[key] = (self.pending.get(key, "") + text).split("\n")
            yield from filter(None, (_strip_ansi(line).rstrip() for line in done))

    def rest(self) -> Iterator[str]:
        """What is left without a newline at the end of the build."""
        yield from filter(None, (_strip_ansi(text).rstrip() for text in self.pending.values()))
        self.pending.clear()


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\r", "", text)
