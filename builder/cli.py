"""The ``builder`` command line. Each command is a thin layer over one module.

User errors (``UserError``) print one line per problem and exit 2; a failing target exits 1.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from builder.errors import UserError
from builder.project import Project, load_project


def _index_pairs(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, url = value.partition("=")
        if not sep or not key or not url:
            raise click.BadParameter(f"{value!r}: expected KEY=URL, e.g. rocm5.7=https://mirror.example/whl/rocm5.7")
        out[key] = url
    return out


def project_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options every command shares: where the matrix and wheel mapping are, mirrors, pinning."""

    @click.option(
        "--matrix", "matrix_path", default="matrix.yaml", show_default=True, type=click.Path(dir_okay=False),
        help="The build matrix; its folder is the project root (templates/, images/, base.lock.json).",
    )
    @click.option(
        "--wheel-mapping", "mapping_path", default=None, type=click.Path(dir_okay=False),
        help="Wheel mapping (default: wheel-mapping.json beside the matrix).",
    )
    @click.option(
        "--index", "indexes", multiple=True, metavar="KEY=URL",
        help="Point a wheel-mapping entry at a mirror (also BUILDER_INDEX_<KEY>=URL).",
    )
    @click.option(
        "--allow-unpinned", is_flag=True, help="Accept a base not pinned by digest (never for published images).",
    )
    @functools.wraps(func)
    def wrapper(matrix_path: str, mapping_path: str | None, indexes: tuple[str, ...], allow_unpinned: bool, **kw: Any):
        project = load_project(
            matrix_path, mapping_path, allow_unpinned=allow_unpinned, index_overrides=_index_pairs(indexes)
        )
        return func(project, **kw)

    return wrapper


target_option = click.option(
    "--target", "-t", "targets", multiple=True, metavar="T",
    help="Target or group name (repeatable); default: the 'default' group.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ml-image-builder")
def cli() -> None:
    """Build, test and publish one ML image per accelerator backend from matrix.yaml."""


@cli.command("render")
@project_options
@target_option
@click.option("--check", is_flag=True, help="Exit 1 if images/ differs from a fresh render; write nothing.")
def render_cmd(project: Project, targets: tuple[str, ...], check: bool) -> None:
    """Write images/<target>/Dockerfile for each target (atomically)."""
    from builder import render

    selected = project.select(targets, group="all")
    if check:
        diff = render.check(project, selected if targets else project.targets)
        if diff:
            sys.stdout.writelines(diff)
            click.echo("images/ is stale: run 'builder render' and commit the result", err=True)
            sys.exit(1)
        click.echo(f"images/ is up to date ({len(selected)} targets)")
        return
    changed = render.write(render.render(project, selected))
    for path in changed:
        click.echo(f"wrote {path.relative_to(project.root)}")
    if not targets:
        for folder in render.stale_folders(project):
            click.echo(f"note: {folder.relative_to(project.root)}/ belongs to no target; delete it", err=True)
    if not changed:
        click.echo(f"images/ already up to date ({len(selected)} targets)")


@cli.command("print")
@project_options
@target_option
def print_cmd(project: Project, targets: tuple[str, ...]) -> None:
    """Print the fully resolved configuration as JSON, without building (like bake --print)."""
    data = project.resolved()
    if targets:
        names = {t.name for t in project.select(targets)}
        data["targets"] = [t for t in data["targets"] if t["name"] in names]
    click.echo(json.dumps(data, indent=2))


@cli.command("matrix")
@project_options
@click.option("--format", "fmt", type=click.Choice(["json", "github"]), default="json", show_default=True,
              help="json: a list of targets; github: {'include': [...]} for strategy.matrix via fromJSON.")
@click.option("--group", default="default", show_default=True, help="Which group of targets.")
def matrix_cmd(project: Project, fmt: str, group: str) -> None:
    """Print the targets of a group for a CI matrix."""
    try:
        names = project.matrix.group(group)
    except KeyError:
        raise UserError(f"--group: unknown group {group!r} (known: default, all, {', '.join(project.matrix.groups)})")
    rows = [
        {"target": t.name, "backend": t.backend, "vendor": t.vendor, "torch": t.torch_pin, "tags": t.tags}
        for t in (project.target(n) for n in names)
    ]
    click.echo(json.dumps({"include": rows} if fmt == "github" else rows, separators=(",", ":")))


@cli.command("lint")
@project_options
@target_option
def lint_cmd(project: Project, targets: tuple[str, ...]) -> None:
    """Run hadolint on the rendered Dockerfiles (failure threshold: warning)."""
    from builder import lint

    problems = lint.lint(project, project.select(targets, group="all"))
    for line in problems:
        click.echo(line)
    if problems:
        sys.exit(1)
    click.echo("hadolint: clean")


def main() -> None:
    """Entry point: map user errors to exit 2 with one line per problem, never a traceback."""
    try:
        cli.main(standalone_mode=False)
    except UserError as exc:
        for line in exc.lines:
            click.echo(f"error: {line}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except SystemExit:
        raise
