"""The ``builder`` command line. Each command is a thin layer over one module.

User errors (``UserError``) print one line per problem and exit 2; a failing target exits 1.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from builder.commands_host import doctor_cmd, run_cmd
from builder.commands_scale import bake_cmd
from builder.errors import UserError
from builder.options import project_options, target_option
from builder.project import Project, load_project


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


@cli.command("base")
@project_options(pinned=False)
@click.option("--check", is_flag=True, help="Bootstrap afresh and say whether base.lock.json still matches (exit 1 if not).")
@click.option("--update", is_flag=True, help="Re-pin when a fresh bootstrap differs from the lock (mirror moved).")
def base_cmd(project: Project, check: bool, update: bool) -> None:
    """Make (or reuse), push and pin the shared base in base.lock.json."""
    import tempfile
    from pathlib import Path

    from builder import base, render
    from builder.baselock import read_lock

    spec = project.matrix.base.bootstrap
    if check:
        lock = read_lock(project.root)
        if spec is None or lock is None:
            raise UserError("base --check needs a bootstrap: spec and a base.lock.json; run 'builder base' first")
        with tempfile.TemporaryDirectory(prefix="builder-base-") as tmp:
            image_id, rootfs = base.image_id_of(spec, Path(tmp))
        if image_id == lock.image_id:
            click.echo(f"base.lock.json matches a fresh bootstrap ({image_id})")
            return
        click.echo(f"base drift: a fresh bootstrap is {image_id}, base.lock.json pins {lock.image_id}")
        for line in base.drift_report(lock.packages, rootfs.packages):
            click.echo(line)
        click.echo("run 'builder base --update' to re-pin, then commit base.lock.json and images/")
        sys.exit(1)
    from builder.engine import connect

    lock = base.ensure_base(connect(), project, update=update, say=click.echo)
    click.echo(f"base: {lock.reference} (image {lock.image_id})")
    fresh = load_project(project.matrix_path, project.mapping_path)
    changed = render.write(render.render(fresh, fresh.targets))
    if changed:
        click.echo(f"re-rendered {len(changed)} Dockerfiles for the new base pin")


@cli.command("lock")
@project_options
@target_option
def lock_cmd(project: Project, targets: tuple[str, ...]) -> None:
    """Resolve wheels on the host into the wheelhouse and write the hash locks."""
    from builder import wheels

    failed = wheels.lock_all(project, project.select(targets), click.echo)
    for name, error in failed.items():
        click.echo(f"{name}: {error}", err=True)
    sys.exit(1 if failed else 0)


def _report(outcomes: list[Any], as_json: bool) -> None:
    from builder.progress import summary

    if as_json:
        keys = ("target", "tags", "image_id", "size_bytes", "seconds", "smoke", "steps", "cached_steps",
                "digest", "error")
        click.echo(json.dumps([{k: o.as_dict()[k] for k in keys} for o in outcomes], indent=2))
    else:
        from rich.console import Console

        Console(stderr=True).print(summary(outcomes))
    if any(o.error for o in outcomes):
        sys.exit(1)


@cli.command("build")
@project_options
@target_option
@click.option("--push", is_flag=True, help="Push every tag after the smoke test passes (aliases last).")
@click.option("--keep-going", "-k", is_flag=True, help="A failing target doesn't stop the others.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON on stdout.")
@click.option("--jobs", "-j", default=1, show_default=True, type=click.IntRange(1, 16),
              help="Targets built concurrently; the shared stage is built once first.")
@click.option("--no-smoke", is_flag=True, help="Skip the smoke test (the result says 'skipped').")
@click.option("--quiet", "-q", is_flag=True, help="Progress bars only, no build log.")
def build_cmd(project: Project, targets: tuple[str, ...], push: bool, keep_going: bool, as_json: bool,
              jobs: int, no_smoke: bool, quiet: bool) -> None:
    """Build, smoke-test, tag (and push) targets with docker-py."""
    from builder.build import build_all
    from builder.engine import connect
    from builder.progress import Progress

    client = connect()
    if push:
        from builder.registry import ensure_local

        started = ensure_local(project.matrix.registry.split("/", 1)[0])
        if started:
            click.echo(started, err=True)
    with Progress(verbose=not quiet) as ui:
        outcomes = build_all(client, project, project.select(targets), ui, push=push, smoke=not no_smoke,
                             keep_going=keep_going, jobs=jobs)
    _report(outcomes, as_json)


@cli.command("smoke")
@project_options
@target_option
@click.option("--no-train", is_flag=True, help="Skip the 2-process accelerate training run.")
def smoke_cmd(project: Project, targets: tuple[str, ...], no_train: bool) -> None:
    """Smoke-test the tagged images of targets (build them first)."""
    from builder.engine import connect
    from builder.smoke import smoke_test

    client = connect()
    failed = False
    for target in project.select(targets):
        try:
            client.api.inspect_image(target.primary_ref)
        except Exception:  # noqa: BLE001 - docker raises ImageNotFound or APIError
            click.echo(f"{target.name}: SKIPPED (no image {target.primary_ref}; run 'builder build -t {target.name}')")
            continue
        result = smoke_test(client, project, target, target.primary_ref, train=not no_train, log=click.echo)
        for line in result.skipped:
            click.echo(f"{target.name}: {line}")
        click.echo(f"{target.name}: {result.status.upper()} ({result.summary()})")
        failed |= result.status == "failed"
    sys.exit(1 if failed else 0)


@cli.command("push")
@project_options
@target_option
def push_cmd(project: Project, targets: tuple[str, ...]) -> None:
    """Push already-built targets (versioned tags first, then latest-<vendor>)."""
    from builder import publish
    from builder.engine import connect
    from builder.errors import TargetFailed

    client = connect()
    records, failed = [], False
    for target in project.select(targets):
        try:
            image_id = client.api.inspect_image(target.primary_ref)["Id"]
            records.append(publish.push_target(client, target, image_id))
            click.echo(f"{target.name}: pushed {records[-1]['reference']}")
        except TargetFailed as exc:
            click.echo(f"{target.name}: {exc}", err=True)
            failed = True
        except Exception as exc:  # noqa: BLE001 - ImageNotFound / APIError
            click.echo(f"{target.name}: no local image {target.primary_ref} ({exc.__class__.__name__}); build it first",
                       err=True)
            failed = True
    if records:
        click.echo(f"published manifest: {publish.record(project.root, records)}")
    sys.exit(1 if failed else 0)



cli.add_command(doctor_cmd)
cli.add_command(run_cmd)
cli.add_command(bake_cmd)


def main() -> None:
    """Entry point: map user errors to exit 2 with one line per problem, never a traceback."""
    try:
        code = cli.main(standalone_mode=False)
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
    sys.exit(code if isinstance(code, int) else 0)
