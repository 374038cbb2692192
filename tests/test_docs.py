"""The documentation holds together: every relative link resolves, every command it names exists.

The pages are README.md, docs/*.md and runtime/README.md. A link ``[text](path)`` or
``[text](path#anchor)`` must name a file or folder of the repository, and its anchor a heading
of the target (GitHub's slugs). Every ``make TARGET`` in their code must be a Makefile target that
``make help`` lists (a ``##`` comment), with the variables it sets used by the Makefile; every
``builder COMMAND`` a click command of ``builder.cli`` with the options it names; every
``runtime-check COMMAND`` a subcommand of the in-image runtime with its options. The command table
of docs/commands.md has a row for every ``builder`` command.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from devtools.support import REPO

PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), REPO / "runtime" / "README.md"])
COMMAND_TABLE = REPO / "docs" / "commands.md"

FENCE = re.compile(r"^(```|~~~)")
CODE_SPAN = re.compile(r"(`+)((?:(?!\n[ \t]*\n)[^`])+?)\1")
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)
# A command ends at a shell separator, a comment, or the `--` before the command it starts.
COMMAND_END = re.compile(r"\s(?:--|\||#|&&|;)(?:\s|$)|[;)]|\\$")
OPTION = re.compile(r"(?<![\w-])(--?[a-zA-Z][\w-]*)")


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


@dataclass(frozen=True)
class Page:
    path: Path
    prose: str  # the text outside fenced code (fences blanked, so line numbers hold)
    code: list[tuple[int, str]]  # (line number, text) of fenced code lines and inline code spans

    def line(self, offset: int) -> int:
        return self.prose.count("\n", 0, offset) + 1

    def prose_lines(self) -> list[str]:
        return self.prose.split("\n")


@cache
def read_page(path: Path) -> Page:
    prose: list[str] = []
    code: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        mark = FENCE.match(line.lstrip())
        if fence is not None:
            if mark and line.lstrip().startswith(fence):
                fence = None
            else:
                code.append((number, line))
            prose.append("")
        elif mark:
            fence = mark.group(1)
            prose.append("")
        else:
            prose.append(line)
    text = "\n".join(prose)
    for span in CODE_SPAN.finditer(text):  # a span may wrap onto the next line, not past a paragraph
        code.append((text.count("\n", 0, span.start()) + 1, " ".join(span.group(2).split())))
    return Page(path, text, sorted(code))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lowercase, punctuation dropped, spaces as '-'.

    Example:
        >>> slug("Platforms: x86_64 and arm64 (Grace Hopper, Grace Blackwell)")
        'platforms-x86_64-and-arm64-grace-hopper-grace-blackwell'
        >>> slug("A tour of `matrix.yaml`")
        'a-tour-of-matrixyaml'
        >>> slug("Speed ([`make bench`](speed.md))")
        'speed-make-bench'
    """
    text = LINK.sub(lambda m: m.group(1), heading)  # a link renders as its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)  # _emphasis_, not snake_case
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every heading's anchor in a Markdown file, repeated headings numbered as GitHub does."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in read_page(path).prose_lines():
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def links(page: Page) -> list[tuple[int, str]]:
    text = CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), page.prose)  # in code: no link
    return [(page.line(m.start()), m.group(2)) for m in LINK.finditer(text)]


def link_problem(page: Path, target: str) -> str | None:
    """Why a relative link of ``page`` does not resolve, or None when it does (or is not relative)."""
    if SCHEME.match(target) or target.startswith("//"):
        return None
    path_part, _, anchor = target.partition("#")
    dest = (page.parent / path_part).resolve() if path_part else page
    if not dest.exists():
        return f"no file {path_part!r}"
    try:
        dest.relative_to(REPO)
    except ValueError:
        return f"{path_part!r} is outside the repository"
    if not anchor:
        return None
    if dest.is_dir():
        dest = dest / "README.md"
    if dest.suffix != ".md" or not dest.is_file():
        return f"anchor #{anchor} on {path_part!r}, which has no Markdown headings"
    if anchor not in anchors(dest):
        return f"no heading #{anchor} in {_rel(dest)}"
    return None


def _link_cases() -> list[tuple[Path, int, str]]:
    return [(page, number, target) for page in PAGES for number, target in links(read_page(page))]


def test_the_pages_are_there():
    for name in ("building", "commands", "publishing", "runtime", "clusters", "troubleshooting"):
        assert (REPO / "docs" / f"{name}.md").is_file(), name
    assert len(_link_cases()) > 20, "the link parser finds (almost) nothing"


@pytest.mark.parametrize(
    ("page", "line", "target"),
    _link_cases(),
    ids=[f"{_rel(p)}:{n}:{t}" for p, n, t in _link_cases()],
)
def test_relative_link_resolves(page: Path, line: int, target: str):
    problem = link_problem(page, target)
    assert problem is None, f"{_rel(page)}:{line}: ({target}): {problem}"


def test_every_docs_page_is_linked_from_the_readme_and_the_docs_index():
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"README.md"}
    for index in (REPO / "README.md", REPO / "docs" / "README.md"):
        linked = {
            (index.parent / t.partition("#")[0]).resolve().name
            for _, t in links(read_page(index))
            if not SCHEME.match(t)
        }
        assert pages <= linked, f"{_rel(index)} does not link {sorted(pages - linked)}"


# --- commands -------------------------------------------------------------------------------------


def mentions(program: str, pages: list[Path] = PAGES) -> list[tuple[str, int, str, str]]:
    """``(page, line, command, rest)`` for every ``PROGRAM COMMAND ...`` in the pages' code.

    Example:
        >>> [m[2:] for m in mentions("builder") if m[0] == "docs/commands.md"][:2]
        [('render', ' [--check] [-t T]'), ('print', ' [-t T] [--schema]')]
    """
    # where a shell reads a command: a span's or line's start, after a prompt, a pipe, `&&` or `(`
    head = re.compile(rf"(?:^\s*|(?:^|\s)\$\s+|(?:\||&&|\$?\()\s*){re.escape(program)} +([a-z][a-z0-9-]*)")
    found = []
    for page in pages:
        for number, text in read_page(page).code:
            for match in head.finditer(text):
                rest = text[match.end() :]
                end = COMMAND_END.search(rest)
                found.append((_rel(page), number, match.group(1), rest[: end.start()] if end else rest))
    return found


@cache
def make_targets() -> dict[str, str]:
    """The Makefile's targets and their ``##`` help text ('' for one ``make help`` does not list)."""
    targets: dict[str, str] = {}
    for line in (REPO / "Makefile").read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([a-z][a-z0-9-]*)\s*:(?!=)(.*)$", line)
        if match:
            targets[match.group(1)] = match.group(2).partition("## ")[2].strip()
    return targets


@cache
def click_commands() -> dict[str, set[str]]:
    from builder.cli import cli

    return {
        name: {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
        for name, command in cli.commands.items()
    }


@cache
def runtime_commands() -> dict[str, set[str]]:
    """runtime-check's subcommands and their options, from the runtime in this checkout."""
    script = (
        "import argparse, json; from ml_runtime.cli import build_parser\n"
        "sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))\n"
        "print(json.dumps({n: sorted(p._option_string_actions) for n, p in sub.choices.items()}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO / "runtime",
        env={"PYTHONPATH": str(REPO / "runtime"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return {name: set(opts) for name, opts in json.loads(out).items()}


def test_the_mention_parsers_find_commands():
    assert len(mentions("make")) > 10 and len(mentions("builder")) > 40 and mentions("runtime-check")


@pytest.mark.parametrize(
    ("page", "line", "target", "rest"),
    mentions("make"),
    ids=[f"{p}:{n}:make {t}" for p, n, t, _ in mentions("make")],
)
def test_make_target_exists(page: str, line: int, target: str, rest: str):
    targets = make_targets()
    assert target in targets, f"{page}:{line}: `make {target}`: no such Makefile target"
    assert targets[target], f"{page}:{line}: `make {target}` has no ## comment: `make help` omits it"
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    for var in re.findall(r"(?<![\w-])([A-Z][A-Z0-9_]*)=", rest):
        assert f"$({var})" in makefile or f"$(or $({var})" in makefile, (
            f"{page}:{line}: `make {target} {var}=...`: the Makefile does not use {var}"
        )


@pytest.mark.parametrize(
    ("page", "line", "command", "rest"),
    mentions("builder"),
    ids=[f"{p}:{n}:builder {c}" for p, n, c, _ in mentions("builder")],
)
def test_builder_command_exists(page: str, line: int, command: str, rest: str):
    commands = click_commands()
    assert command in commands, f"{page}:{line}: `builder {command}`: no such command ({sorted(commands)})"
    unknown = [opt for opt in OPTION.findall(rest) if opt not in commands[command] | {"--help"}]
    assert not unknown, f"{page}:{line}: `builder {command}` has no option {unknown}"


@pytest.mark.parametrize(
    ("page", "line", "command", "rest"),
    mentions("runtime-check"),
    ids=[f"{p}:{n}:runtime-check {c}" for p, n, c, _ in mentions("runtime-check")],
)
def test_runtime_check_command_exists(page: str, line: int, command: str, rest: str):
    commands = runtime_commands()
    assert command in commands, f"{page}:{line}: `runtime-check {command}`: no such subcommand"
    unknown = [opt for opt in OPTION.findall(rest) if opt not in commands[command]]
    assert not unknown, f"{page}:{line}: `runtime-check {command}` has no option {unknown}"


def command_table() -> list[tuple[int, list[str]]]:
    """``(line, [command spans])`` of each row of docs/commands.md's command table."""
    rows = []
    for number, line in enumerate(read_page(COMMAND_TABLE).prose_lines(), start=1):
        cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
        if len(cells) < 2 or set(cells[0].strip()) <= set("-: ") or cells[0].strip() == "command":
            continue
        rows.append((number, [m.group(2) for m in CODE_SPAN.finditer(cells[0])]))
    return rows


def test_the_command_table_has_a_row_for_every_builder_command():
    rows = command_table()
    assert rows, f"no command table in {_rel(COMMAND_TABLE)}"
    listed = {
        m.group(1)
        for _, spans in rows
        for span in spans
        for m in [re.match(r"builder ([a-z0-9-]+)", span)]
        if m
    }
    assert set(click_commands()) <= listed, f"the table lacks {sorted(set(click_commands()) - listed)}"


@pytest.mark.parametrize(("line", "spans"), command_table(), ids=[str(n) for n, _ in command_table()])
def test_command_table_row_resolves(line: int, spans: list[str]):
    assert spans, f"{_rel(COMMAND_TABLE)}:{line}: a row whose first cell names no command"
    commands = click_commands()
    for span in spans:
        match = re.match(r"builder ([a-z0-9-]+)(.*)$", span)
        assert match, f"{_rel(COMMAND_TABLE)}:{line}: {span!r} is no `builder` command"
        command, rest = match.groups()
        assert command in commands, f"{_rel(COMMAND_TABLE)}:{line}: no command {command!r}"
        end = COMMAND_END.search(rest)
        unknown = [
            o for o in OPTION.findall(rest[: end.start()] if end else rest) if o not in commands[command]
        ]
        assert not unknown, f"{_rel(COMMAND_TABLE)}:{line}: `builder {command}` has no option {unknown}"
