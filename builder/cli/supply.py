"""The supply-chain command: ``verify``. A thin layer over :mod:`builder.supply.verify`.

Example:
    $ builder verify localhost:5000/ml-runtime:cpu --key cosign.pub
    PASS sig: signed by key 922d4954880d, names localhost:5000/ml-runtime@sha256:...
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from builder.cli.options import connect_engine, engine_option
from builder.config.errors import UserError


@click.command("verify")
@click.argument("ref")
@click.option("--key", "key_path", default=None, metavar="PUB", type=click.Path(dir_okay=False),
              help="The PEM public key the signatures must verify with (default: the PEM text in "
              "$BUILDER_VERIFY_KEY).")
@click.option("--rebuild", is_flag=True,
              help="Then build the image again from its signed provenance (the commit, checked out from --source) "
              "on this machine's engine, and compare: exit 0 when it is the same image, else one line per "
              "differing layer with its sizes and first differing path.")
@click.option("--source", "source_path", default=".", show_default=True, type=click.Path(file_okay=False),
              help="With --rebuild: the git checkout holding the image's commit.")
@click.option("--platform", default=None, metavar="OS/ARCH", type=click.Choice(["linux/amd64", "linux/arm64"]),
              help="With --rebuild and an index: the platform image to rebuild (default: this host's).")
@engine_option
def verify_cmd(ref: str, key_path: str | None, rebuild: bool, source_path: str, platform: str | None,
               engine_choice: str | None) -> None:
    """Check the image REF names: its signature, SBOM and provenance are attached to its digest,
    signed by KEY, and name exactly that digest (for an index: the index's signature and every
    platform image). Prints one PASS or FAIL line per check; exits 1 if any fails. With --rebuild,
    a last line says whether this machine builds the same image from that provenance."""
    from builder.supply.signing import load_public_key
    from builder.supply.verify import verify

    key = load_public_key(key_path)
    checks = verify(ref, key)
    for check in checks:
        click.echo(check.line())
    if not all(c.ok for c in checks):
        if rebuild:
            click.echo("FAIL rebuild: not attempted, the checks above failed")
        sys.exit(1)
    if rebuild:
        sys.exit(_rebuild(ref, key, Path(source_path), platform, engine_choice))


def _rebuild(ref: str, key: Any, root: Path, platform: str | None, engine_choice: str | None) -> int:
    from builder.oci import registry
    from builder.supply import rebuild
    from builder.supply.verify import signed_provenance

    creds = registry.credentials(registry.Ref.parse(ref).host)
    pub = rebuild.published(ref, platform, creds)
    recorded = rebuild.Recorded.of(signed_provenance(pub.subject, key, creds))
    if recorded.dirty:
        raise UserError(f"{pub.subject} was built from {recorded.commit[:12]} with uncommitted changes: its source "
                        "is in no commit, so it cannot be rebuilt")
    say = lambda line: click.echo(line, err=True)
    with rebuild.source(root, recorded.commit, say) as folder:
        rebuild.check_inputs(folder, recorded)
        image_id = rebuild.rebuild(folder, recorded, engine_choice)
    lines = rebuild.compare(connect_engine(engine_choice), image_id, pub, creds)
    what = f"{recorded.target} ({recorded.platform}) from {recorded.commit[:12]}"
    if not lines:
        same = "the published image" if image_id in (pub.digest, pub.config_digest) else \
            "every layer and the configuration of the published image (its BuildKit cache record aside)"
        click.echo(f"PASS rebuild: {what} gives {image_id}: {same} ({pub.digest}), {len(pub.layers)} layers")
        return 0
    for line in lines:
        click.echo(f"FAIL rebuild: {what}: {line}")
    return 1
