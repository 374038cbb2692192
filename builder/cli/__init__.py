"""The ``builder`` command line: the ``builder`` group and its entry point, :func:`main`.

The commands live beside it: ``cli/images.py`` (render, print, matrix, lint, base, lock, build,
smoke, push, bake, gc), ``cli/host.py`` (doctor, run), ``cli/cluster.py`` (slurm, k8s) and ``cli/supply.py`` (verify); ``cli/options.py`` holds the options they
share. A new command goes into the module of its kind, as a ``@click.command`` added to the group
below; it stays a thin layer over a module of :mod:`builder.images`, :mod:`builder.cluster`,
:mod:`builder.supply` or :mod:`builder.host`. Only
this package imports click.

A command imports the modules it runs inside its function, the one place in builder/ that does:
importing every command's modules at start-up costs ~0.8 s more (the supply chain's CycloneDX and
JSON-schema models, the cluster templates; ``python -X importtime -m builder --help``), and a no-op
``builder build`` must stay well under a second.

User errors (``UserError``) print one line per problem and exit 2; a failing target exits 1; the
engine's and registries' faults one line and 3 or 4 (:mod:`builder.oci.faults`); never a traceback.
"""

from __future__ import annotations

import gc
import os
import sys

import click

from builder.cli.cluster import k8s_cmd, slurm_cmd
from builder.cli.host import doctor_cmd, run_cmd
from builder.cli.images import (
    bake_cmd,
    base_cmd,
    build_cmd,
    gc_cmd,
    lint_cmd,
    lock_cmd,
    matrix_cmd,
    print_cmd,
    push_cmd,
    render_cmd,
    smoke_cmd,
)
from builder.cli.options import Session
from builder.cli.supply import verify_cmd
from builder.config.errors import TargetFailed, UserError
from builder.config.urls import redact
from builder.oci import faults


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ml-image-builder")
def cli() -> None:
    """Build, test and publish one ML image per accelerator backend from matrix.yaml."""


for _command in (render_cmd, print_cmd, matrix_cmd, lint_cmd, base_cmd, lock_cmd, build_cmd, smoke_cmd, push_cmd,
                 gc_cmd, doctor_cmd, run_cmd, bake_cmd, slurm_cmd, k8s_cmd, verify_cmd):
    cli.add_command(_command)


def main() -> None:
    """Entry point: map user errors to exit 2 with one line per problem, never a traceback."""
    # Teardown would walk every object once more for cycles: ~0.25 s of a 1 s no-op build. Nothing
    # of ours relies on a cycle being collected at exit (files and sockets close by refcount).
    try:
        code = _run()
    finally:
        gc.freeze()
    sys.exit(code)


def _run() -> int:
    session = Session()
    try:
        code = cli.main(standalone_mode=False, obj=session)
    except UserError as exc:
        for line in exc.lines:
            click.echo(f"error: {redact(line)}", err=True)
        return 2
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        return 130
    except TargetFailed as exc:
        click.echo(f"error: {redact(str(exc))}", err=True)
        return 1
    except Exception as exc:  # the engine, a registry, or our own fault: one line, its class's code
        if os.environ.get("BUILDER_TRACEBACK"):
            raise
        fault = faults.describe(exc, session.engine)
        click.echo(f"error: {redact(fault.line)}", err=True)
        return fault.code
    return code if isinstance(code, int) else 0
