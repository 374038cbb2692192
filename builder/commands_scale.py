"""Commands for building at scale elsewhere: ``builder bake`` (registered in cli.py).

Example:
    $ builder bake                      # writes docker-bake.json beside matrix.yaml
    $ builder bake --print -t cpu       # the definition on stdout
    $ docker buildx bake -f docker-bake.json buildable-here
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from builder.options import project_options, target_option
from builder.project import Project


@click.command("bake")
@project_options
@target_option
@click.option("--output", "-o", "output", default=None, type=click.Path(dir_okay=False),
              help="Where to write it (default: docker-bake.json beside the matrix).")
@click.option("--print", "to_stdout", is_flag=True, help="Print the definition on stdout instead of writing it.")
def bake_cmd(project: Project, targets: tuple[str, ...], output: str | None, to_stdout: bool) -> None:
    """Write the matrix as a docker-bake.json (targets, tags, labels, groups, registry cache)."""
    from builder import wheelserver
    from builder.bake import bake_definition
    from builder.files import atomic_write

    text = json.dumps(bake_definition(project, project.select(targets, group="all")), indent=2) + "\n"
    if to_stdout:
        click.echo(text, nl=False)
        return
    path = Path(output) if output else project.root / "docker-bake.json"
    atomic_write(path, text)
    port = project.matrix.wheelhouse_port
    click.echo(f"wrote {path}; before 'docker buildx bake -f {path.name}', run 'builder lock' and serve the "
               f"wheelhouse on 127.0.0.1:{port} (the Dockerfiles install from {wheelserver.url(port)})")
