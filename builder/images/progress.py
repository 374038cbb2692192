"""Progress on stderr with rich: one bar per target, the build log streaming above it.

In a terminal, rich's live view; in a log (CI, a pipe, a file) plain lines that are never wrapped
or cut, the closing table one line per row, and a line at least every ``HEARTBEAT_S`` seconds
while a long step is silent (a ``RUN`` installing torch, the export of the layers: :mod:`builder.config.heartbeat`).
"""

from __future__ import annotations

import threading
import time

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

from builder.config.heartbeat import HEARTBEAT_S
from builder.images.outcome import Outcome


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
                self._print(f"[dim]{escape(target)} |[/] still running: {escape(doing)} ({now - since:.0f} s)")

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
