"""Running vendor tools safely and reading their CSV output.

Every vendor tool (nvidia-smi, amd-smi, rocm-smi, xpu-smi) may be missing,
hang or fail; :func:`run_tool` turns all of that into a note instead of a
traceback. The CSV helpers normalise headers case-insensitively and strip
units, because headers differ between tool versions (``Card series`` vs
``Card Series``, ``memory.total [MiB]`` vs ``memory.total``).

Example:
    >>> rows = parse_csv_table("index, memory.total [MiB]\\n0, 8188 MiB\\n")
    >>> rows[0]["memory.total"], parse_number(rows[0]["memory.total"])
    ('8188 MiB', 8188.0)
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

DEFAULT_TIMEOUT_S = 15.0

_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_BRACKET_UNIT = re.compile(r"\s*\[([^\]]*)\]\s*$")
_MISSING = {"", "n/a", "[n/a]", "na", "none", "[not supported]", "not supported", "unknown"}


@dataclass(frozen=True)
class ToolResult:
    """Outcome of one tool invocation.

    Example:
        >>> ToolResult(ok=False, stdout="", note="amd-smi not found on PATH").ok
        False
    """

    ok: bool
    stdout: str
    note: str | None = None


# A runner takes argv and returns a ToolResult; tests inject fakes.
Runner = Callable[[Sequence[str]], ToolResult]


def run_tool(argv: Sequence[str], timeout: float = DEFAULT_TIMEOUT_S) -> ToolResult:
    """Run ``argv`` and capture stdout; never raises.

    Example:
        >>> run_tool(["definitely-not-a-tool-xyz"]).note
        'definitely-not-a-tool-xyz not found on PATH'
    """
    name = argv[0]
    exe = shutil.which(name)
    if exe is None:
        return ToolResult(False, "", f"{name} not found on PATH")
    try:
        proc = subprocess.run(
            [exe, *argv[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return ToolResult(False, "", f"{name} timed out after {timeout:.0f} s")
    except OSError as exc:
        return ToolResult(False, "", f"{name} could not run: {exc.strerror or exc}")
    if proc.returncode != 0:
        detail = last_line(proc.stderr) or last_line(proc.stdout) or "no output"
        return ToolResult(False, proc.stdout, f"{name} exited {proc.returncode}: {detail}")
    return ToolResult(True, proc.stdout, None)


def last_line(text: str | None) -> str:
    """Last non-blank line of ``text`` (for short error notes).

    Example:
        >>> last_line("a\\nb\\n\\n")
        'b'
    """
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def normalize_header(header: str) -> tuple[str, str | None]:
    """Lower-case a CSV header, collapse spaces and split off a ``[unit]``.

    Example:
        >>> normalize_header(" Memory.Total [MiB] ")
        ('memory.total', 'MiB')
        >>> normalize_header("Card Series")
        ('card series', None)
    """
    text = header.strip().strip('"').strip()
    unit = None
    match = _BRACKET_UNIT.search(text)
    if match:
        unit = match.group(1).strip()
        text = text[: match.start()]
    return " ".join(text.lower().split()), unit


def parse_csv_table(text: str) -> list[dict[str, str]]:
    """Parse CSV with a header row into dicts keyed by normalised header.

    Blank lines are skipped; cells are stripped; short rows are padded with "".

    Example:
        >>> parse_csv_table('device,Card series\\ncard0,"AMD Instinct MI210"\\n')
        [{'device': 'card0', 'card series': 'AMD Instinct MI210'}]
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    reader = csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True)
    rows = list(reader)
    header = [normalize_header(h)[0] for h in rows[0]]
    table = []
    for row in rows[1:]:
        cells = [cell.strip() for cell in row] + [""] * (len(header) - len(row))
        table.append(dict(zip(header, cells)))
    return table


def parse_number(value: object) -> float | None:
    """Leading number of a cell such as ``8188 MiB``, ``35 %`` or ``41.0``.

    ``N/A``, ``[Not Supported]`` and empty cells give ``None``.

    Example:
        >>> parse_number("8188 MiB"), parse_number("[N/A]"), parse_number(12)
        (8188.0, None, 12.0)
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    if text.lower() in _MISSING:
        return None
    match = _NUMBER.search(text)
    return float(match.group(0)) if match else None


def pick(row: dict[str, str], *candidates: str) -> str | None:
    """First non-missing cell among candidate (normalised) header names.

    Example:
        >>> pick({"card series": "MI210"}, "card series", "card model")
        'MI210'
    """
    for key in candidates:
        value = row.get(key)
        if value is not None and value.strip().lower() not in _MISSING:
            return value.strip()
    return None
