"""Progress on stderr with rich: one bar per target, the build log streaming above it."""

from __future__ import annotations

import threading

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

from builder.images.outcome import Outcome


class Progress:
    """Build progress: ``start``/``step``/``log``/``done`` per target, ``say`` for notes.

    Example:
        >>> with Progress(verbose=False) as ui:
        ...     ui.start("cpu"); ui.step("cpu", 3, 12, "RUN pip install ...")
    """

    def __init__(self, verbose: bool = True, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, highlight=False)
        self.verbose = verbose
        self._lock = threading.Lock()
        self._bar = RichProgress(
            TextColumn("[bold]{task.fields[target]:<16}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("{task.description}"),
            console=self.console, transient=False,
        )
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> Progress:  # noqa: PYI034 - final class
        self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def say(self, text: str) -> None:
        self._bar.console.print(escape(text), soft_wrap=True)  # one line, at any width: a log greps it

    def start(self, target: str) -> None:
        with self._lock:
            self._tasks[target] = self._bar.add_task("queued", total=None, target=target)

    def step(self, target: str, n: int, total: int, text: str) -> None:
        task = self._tasks.get(target)
        if task is not None:
            self._bar.update(task, completed=n, total=total, description=escape(text[:60]))

    def log(self, target: str, line: str) -> None:
        if self.verbose:
            self._bar.console.print(f"[dim]{escape(target)} |[/] {escape(line)}")

    def done(self, target: str, outcome: Outcome) -> None:
        task = self._tasks.get(target)
        status = "[red]failed" if outcome.error else "[green]done"
        if task is not None:
            self._bar.update(task, description=status)
        if outcome.error:
            self._bar.console.print(f"[red]{escape(target)}: {escape(outcome.error)}")


def summary(outcomes: list[Outcome]) -> Table:
    """The closing table: target, platform, tags, size, seconds, layers from cache, smoke, result."""
    table = Table(title="builder build")
    for col in ("target", "platform", "tags", "size", "seconds", "cached", "smoke", "result"):
        table.add_column(col)
    for o in outcomes:
        size = f"{o.size_bytes / 1e9:.2f} GB" if o.size_bytes else "-"
        table.add_row(
            o.target, o.platform or "-", ", ".join(o.tags) or "-", size, f"{o.seconds:.1f}",
            f"{o.cached_steps}/{o.steps}" if o.steps else "-", o.smoke,
            "[red]FAILED" if o.error else f"[green]{o.result or 'ok'}",
        )
    return table
