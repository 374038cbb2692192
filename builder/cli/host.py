"""The host commands: ``builder doctor`` and ``builder run`` (added to the group in ``builder/cli/__init__.py``).

Example:
    $ builder doctor --json
    $ builder run -- python examples/train.py --epochs 1
    $ builder run --target cpu --env SEED=1 --dry-run -- python -V
"""

from __future__ import annotations

import json
import sys

import click

from builder.cli.options import connect_engine, engine_option, project_options
from builder.config.project import Project

# Where builder.host.hardware looks; other roots are for tests and for running builder inside a container.
_sysfs_option = click.option("--sysfs-root", default="/sys", envvar="BUILDER_SYSFS_ROOT", hidden=True)
_dev_option = click.option("--dev-root", default="/dev", envvar="BUILDER_DEV_ROOT", hidden=True)
# Where CDI specs are read (repeatable); default builder.host.cdi.CDI_DIRS, where the engines read them.
_cdi_option = click.option("--cdi-dir", "cdi_dirs", multiple=True, envvar="BUILDER_CDI_DIRS", hidden=True)


@click.command("doctor")
@engine_option
@click.option(
    "--matrix",
    "matrix_path",
    default="matrix.yaml",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="The build matrix (for the registry and base); a broken one is reported, not fatal.",
)
@click.option(
    "--wheel-mapping",
    "mapping_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Wheel mapping (default: wheel-mapping.json beside the matrix).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON on stdout.")
@click.option(
    "--write-vendor",
    "vendor_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="Also write the vendor builder run picks here (nvidia|amd|intel|cpu), e.g. /opt/gpu-config/vendor "
    "as the design notes' host-init.sh does.",
)
@_sysfs_option
@_dev_option
@_cdi_option
def doctor_cmd(
    matrix_path: str,
    mapping_path: str | None,
    as_json: bool,
    vendor_file: str | None,
    sysfs_root: str,
    dev_root: str,
    cdi_dirs: tuple[str, ...],
    engine_choice: str | None,
) -> None:
    """Check this host: engine, GPUs and their runtime/devices, disk, registry, tools.

    Each item prints [OK], [WARN] or [FAIL] with what was found and, for problems, the fix.
    Exits 1 if any item fails.
    """
    from builder.host import doctor, hardware

    checks = doctor.run_checks(matrix_path, mapping_path, sysfs_root=sysfs_root, dev_root=dev_root,
                               cdi_dirs=cdi_dirs or hardware.CDI_DIRS, engine=engine_choice)
    checks += doctor.store_checks(*_store_sizes(matrix_path, mapping_path, engine_choice))
    if as_json:
        click.echo(json.dumps(doctor.as_json(checks), indent=2))
    else:
        for check in checks:
            color = {"ok": "green", "warn": "yellow", "fail": "red"}[check.status]
            tag, _, rest = check.line().partition(" ")
            click.echo(click.style(tag, fg=color, bold=True) + " " + rest)
    status = doctor.exit_status(checks)
    if vendor_file:
        from pathlib import Path

        from builder.config.files import atomic_write

        vendor, why = hardware.choose_vendor(hardware.detect(sysfs_root, dev_root))
        try:
            Path(vendor_file).parent.mkdir(parents=True, exist_ok=True)
            atomic_write(Path(vendor_file), vendor + "\n")
            click.echo(f"wrote vendor {vendor} to {vendor_file} ({why})", err=as_json)
        except OSError as exc:
            click.echo(f"[FAIL] vendor file: cannot write {vendor_file}: {exc.strerror or exc}; run as root "
                       "or pass another path", err=True)
            status = 1
    sys.exit(status)


def _store_sizes(matrix_path: str, mapping_path: str | None,
                 engine_choice: str | None) -> tuple[dict[str, tuple[int, str]] | None, str]:
    """What each of the builder's stores holds (``builder gc``'s measure), or None and why not."""
    try:
        from builder.config.project import load_project
        from builder.gc import stores as gc
        from builder.oci.connect import connect

        project = load_project(matrix_path, mapping_path, allow_unpinned=True)
        try:
            engine = connect(kind=engine_choice)
        except Exception:  # noqa: BLE001 - no engine: the files' stores alone (the daemon check says why)
            engine = None
        found = gc.collect(engine, project, items=False)
        return {s.store: (s.held, s.where) for s in found.summary() if s.store in found.held}, ""
    except Exception as exc:  # noqa: BLE001 - a broken matrix or engine is reported by the other checks
        return None, str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__


@click.command(
    "run",
    # Everything after the options is the command, with its own options: no '--' needed, but allowed.
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@engine_option
@project_options
@click.option(
    "--target",
    "-t",
    default="auto",
    show_default=True,
    metavar="auto|T",
    help="Target to run; auto: the matrix target of this host's GPU vendor (latest-<vendor>), else cpu.",
)
@click.option(
    "--user",
    "-u",
    default="auto",
    show_default=True,
    metavar="auto|image|UID[:GID]",
    help="Container user. auto: yours unless you are root, so files written to /workspace are "
    "yours; image: the image's user (uid 1001).",
)
@click.option(
    "--gpus/--no-gpus", default=True, show_default=True, help="Give the container the vendor's GPUs."
)
@click.option(
    "--env",
    "-e",
    "env",
    multiple=True,
    metavar="K=V",
    help="Set a variable in the container (repeatable; a bare K passes the host's value).",
)
@click.option(
    "--dry-run", is_flag=True,
    help="Print the target, why, and the engine's own run line (docker run or podman run); run nothing.",
)
@_sysfs_option
@_dev_option
@_cdi_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run_cmd(
    project: Project,
    target: str,
    user: str,
    gpus: bool,
    env: tuple[str, ...],
    dry_run: bool,
    sysfs_root: str,
    dev_root: str,
    cdi_dirs: tuple[str, ...],
    command: tuple[str, ...],
    engine_choice: str | None,
) -> None:
    """Run COMMAND in the image for this host's GPUs, with the current directory at /workspace.

    The container runs as you (your UID:GID; root keeps the image's uid 1001), streams its
    output, and is removed afterwards (also on Ctrl-C); the exit status is the command's.
    """
    from builder.host import hardware, launch
    from builder.host.runspec import format_dry_run, run_spec
    from builder.oci.connect import engine_kind

    cdi_dirs = cdi_dirs or hardware.CDI_DIRS
    host = hardware.detect(sysfs_root, dev_root, nvidia_runtime=bool(hardware.cdi_specs(cdi_dirs)))
    kind = engine_kind(kind=engine_choice)
    plan = run_spec(project, command, target=target, user=user, gpus=gpus, env=env, host=host,
                    engine_info=lambda: launch.engine_info(kind), cdi_dirs=cdi_dirs, engine=kind)
    if dry_run:
        click.echo(format_dry_run(plan))
        return
    # connected here (a bad plan is refused first, without one), so a fault of the engine names it
    engine = connect_engine(kind) if not plan.problems else None
    status = launch.launch(plan, engine=engine, say=lambda line: click.echo(line, err=True))
    sys.exit(status)
