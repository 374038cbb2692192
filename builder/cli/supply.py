"""The supply-chain command: ``verify``. A thin layer over :mod:`builder.supply.verify`.

Example:
    $ builder verify localhost:5000/ml-runtime:cpu --key cosign.pub
    PASS sig: signed by key 922d4954880d, names localhost:5000/ml-runtime@sha256:...
"""

from __future__ import annotations

import sys

import click


@click.command("verify")
@click.argument("ref")
@click.option("--key", "key_path", default=None, metavar="PUB", type=click.Path(dir_okay=False),
              help="The PEM public key the signatures must verify with (default: the PEM text in "
              "$BUILDER_VERIFY_KEY).")
def verify_cmd(ref: str, key_path: str | None) -> None:
    """Check the image REF names: its signature, SBOM and provenance are attached to its digest,
    signed by KEY, and name exactly that digest (for an index: the index's signature and every
    platform image). Prints one PASS or FAIL line per check; exits 1 if any fails."""
    from builder.supply.signing import load_public_key
    from builder.supply.verify import verify

    key = load_public_key(key_path)
    checks = verify(ref, key)
    for check in checks:
        click.echo(check.line())
    sys.exit(0 if all(c.ok for c in checks) else 1)
