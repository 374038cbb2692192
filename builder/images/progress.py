"""Progress on stderr with rich: one bar per target, the build log streaming above it.

In a terminal, rich's live view; in a log (CI, a pipe, a file) plain lines that are never wrapped
or cut, the closing table one line per row, and a line at least every ``HEARTBEAT_S`` seconds
while a long step is silent (a ``RUN`` installing torch, the export of the layers:
:mod:`builder.config.heartbeat`). The build log prints each step whole once, where it starts;
the heartbeat names it in one short line (:func:`step_summary`).
"""

from __future__ import annotations

import re
import threading
import time

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

from builder.config.heartbeat import HEARTBEAT_S
from builder.images.outcome import Outcome

#: A step as BuildKit names it (``[stage n/m] INSTRUCTION ...``; podman's steps have no prefix).
_STEP = re.compile(r"^(?:\[(?P<where>[^\]]+)\]\s+)?(?P<instruction>[A-Z]+)\b\s*(?P<rest>.*)$")
#: A locked wheel in a step's command: ``name==version`` (its hashes follow it).
_PIN = re.compile(r"(?<![\w.=-])([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\"']+)")
#: The most characters of a step in a heartbeat line (the line: about 120 with the target and the time).
SUMMARY_CHARS = 72


def step_summary(text: str, width: int = SUMMARY_CHARS) -> str:
    """A build step in one short line of at most *width* characters: where it is, and for a ``RUN``
    that installs wheels, how many (or which, for one or two); other steps without their flags, cut.
    The step's whole text is in the build log once, where it starts.

    Example:
        >>> step_summary("[common 4/4] RUN --network=none --mount=type=bind,from=wheels-common,target=/w "
        ...              "printf '%s %s\\n' a==1 --hash=sha256:aa b==2 --hash=sha256:bb c==3 --hash=sha256:cc "
        ...              "> /tmp/l && uv pip install --require-hashes -r /tmp/l")
        '[common 4/4] pip install (3 wheels)'
        >>> step_summary('[torch 2/2] RUN if [ -n "torch==2.13.0+cpu --hash=sha256:ab" ]; then printf "%s %s" '
        ...              'torch==2.13.0+cpu --hash=sha256:ab > /tmp/l && uv pip install -r /tmp/l; fi')
        '[torch 2/2] pip install torch==2.13.0+cpu'
        >>> step_summary("exporting to image")
        'exporting to image'
    """
    text = " ".join(text.split())
    match = _STEP.match(text)
    if match is None:
        return _cut(text, width)
    where = f"[{match['where']}] " if match["where"] else ""
    words = match["rest"].split(" ")
    if match["instruction"] == "RUN":
        words = words[next((i for i, w in enumerate(words) if not w.startswith("--")), len(words)):]  # its flags
    command = " ".join(words)
    if match["instruction"] == "RUN" and "pip install" in command:
        return _cut(f"{where}pip install {_installs(match['rest'], command)}".rstrip(), width)
    return _cut(f"{where}{match['instruction']} {command}".rstrip(), width)


def _installs(step: str, command: str) -> str:
    """What a ``pip install`` step installs: its wheels, named when one or two, else counted; with
    its ``WHEELS_<LAYER>`` not expanded in the step's text (podman's), the layer its wheels come from."""
    pins = list(dict.fromkeys(f"{name}=={version}" for name, version in _PIN.findall(command)))
    if pins:
        return ", ".join(pins) if len(pins) <= 2 else f"({len(pins)} wheels)"
    if layer := re.search(r"/wheels/([\w.-]+)", step):
        return f"(the {layer[1]} layer's wheels)"
    return " ".join(w for w in command.split("pip install", 1)[1].split() if not w.startswith("-"))


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _elapsed(seconds: float) -> str:
    """``45s``, ``1m20s``."""
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{rest}s"


def stderr_console() -> Console:
    """stderr's console: a terminal's, or for a log one that never wraps or crops a line (rich's
    default there is 80 columns, which cuts digests and commands mid-word)."""
    term = Console(stderr=True, highlight=False)
    if term.is_terminal:
        return term
    return Console(stderr=True, highlight=False, soft_wrap=True, width=100_000)


class Progress:
    """Build progress: ``start``/``step``/``log``/``done`` per target, ``say`` for notes.

    Example:
        >>> with Progress(verbose=False) as ui:
        ...     ui.start("cpu"); ui.step("cpu", 3, 12, "RUN pip install ...")
    """

    def __init__(self, verbose: bool = True, console: Console | None = None,
                 heartbeat_s: float = HEARTBEAT_S) -> None:
        self.console = console or stderr_console()
        self.verbose = verbose
        self._lock = threading.Lock()
        self._bar = RichProgress(
            TextColumn("[bold]{task.fields[target]:<16}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("{task.description}"),
            console=self.console, transient=False,
        )
        self._tasks: dict[str, TaskID] = {}
        #: per target still running: what it does now, since when
        self._running: dict[str, tuple[float, str]] = {}
        self._heartbeat_s = heartbeat_s
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def __enter__(self) -> Progress:  # noqa: PYI034 - final class
        self._bar.start()
        if not self.console.is_terminal:  # a terminal has the live bars
            self._beat = threading.Thread(target=self._alive, name="progress-heartbeat", daemon=True)
            self._beat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        self._bar.stop()

    def _print(self, text: str) -> None:
        self._last = time.monotonic()
        self._bar.console.print(text, soft_wrap=True)  # one line, at any width: a log greps it

    def _alive(self) -> None:
        """In a log, a line per running target whenever nothing was printed for ``heartbeat_s``."""
        while not self._stop.wait(min(1.0, self._heartbeat_s / 4)):
            now = time.monotonic()
            if now - self._last < self._heartbeat_s:
                continue
            with self._lock:
                running = list(self._running.items())
            if not running:
                self._last = now  # nothing running (the build's own steps say what they do)
            for target, (since, doing) in running:
                self._print(f"[dim]{escape(target)} |[/] still running: {escape(step_summary(doing))} "
                            f"{_elapsed(now - since)}")

    def say(self, text: str) -> None:
        self._print(escape(text))

    def start(self, target: str) -> None:
        with self._lock:
            self._tasks[target] = self._bar.add_task("queued", total=None, target=target)
            self._running[target] = (time.monotonic(), "queued")

    def step(self, target: str, n: int, total: int, text: str) -> None:
        task = self._tasks.get(target)
        if task is not None:
            self._bar.update(task, completed=n, total=total, description=escape(text[:60]))
        doing = " ".join(text.split())
        with self._lock:
            if target in self._running and self._running[target][1] != doing:
                self._running[target] = (time.monotonic(), doing)

    def log(self, target: str, line: str) -> None:
        if self.verbose:
            self._print(f"[dim]{escape(target)} |[/] {escape(line)}")

    def done(self, target: str, outcome: Outcome) -> None:
        task = self._tasks.get(target)
        status = "[red]failed" if outcome.error else "[green]done"
        with self._lock:
            self._running.pop(target, None)
        if task is not None:
            self._bar.update(task, description=status)
        if outcome.error:
            self._print(f"[red]{escape(target)}: {escape(outcome.error)}")


_COLUMNS = ("target", "platform", "tags", "size", "seconds", "cached", "smoke", "result")


def _row(o: Outcome) -> tuple[str, ...]:
    size = f"{o.size_bytes / 1e9:.2f} GB" if o.size_bytes else "-"
    return (o.target, o.platform or "-", ", ".join(o.tags) or "-", size, f"{o.seconds:.1f}",
            f"{o.cached_steps}/{o.steps}" if o.steps else "-", o.smoke, "FAILED" if o.error else o.result or "ok")


def summary(outcomes: list[Outcome]) -> Table:
    """The closing table: target, platform, tags, size, seconds, layers from cache, smoke, result."""
    table = Table(title="builder build")
    for col in _COLUMNS:
        table.add_column(col)
    for o in outcomes:
        *cells, result = _row(o)
        table.add_row(*cells, f"[red]{result}" if o.error else f"[green]{result}")
    return table


def summary_lines(outcomes: list[Outcome]) -> list[str]:
    """The closing table for a log: one line per row, every value whole.

    Example:
        >>> summary_lines([Outcome("cpu", "linux/amd64", ["r/ml:cpu"], size_bytes=9e8, seconds=31.0,
        ...                        steps=9, cached_steps=2, result="built")])
        ['builder build: cpu platform=linux/amd64 result=built size=0.90 GB seconds=31.0 cached=2/9 smoke=skipped tags=r/ml:cpu']
    """
    lines = []
    for o in outcomes:
        target, platform, tags, size, seconds, cached, smoke, result = _row(o)
        lines.append(f"builder build: {target} platform={platform} result={result} size={size} seconds={seconds} "
                     f"cached={cached} smoke={smoke} tags={tags.replace(', ', ',')}")
    return lines


def print_summary(outcomes: list[Outcome], out: Console | None = None) -> None:
    """The table in a terminal; in a log, :func:`summary_lines`."""
    out = out or stderr_console()
    if out.is_terminal:
        out.print(summary(outcomes))
    else:
        for line in summary_lines(outcomes):
            out.print(line, markup=False, highlight=False)
