"""What the builder counts as smoke-tested in a registry: a digest it recorded itself, or one signed with
the configured key; never a name.

A content tag (``<registry>:<target>-<12 hex>``, :mod:`builder.images.content`) names the content an
image was built from, and anyone who can push to the registry can put any image under it. So when
``builder build`` finds a content tag in the registry, it reuses that image (skips the build, moves
its tags, signs it, pulls it) only when its digest is

- one this user's builder pushed under that very content tag after a passed smoke test: the
  ``tested`` ledger (:class:`builder.config.ownership.Ledger`, ``<content tag>@<digest>`` each,
  written by the executor's ``push``); or
- signed by cosign with a configured key (``--sign-key``'s, or ``BUILDER_VERIFY_KEY``'s public
  key), for a registry shared with other runners: a :class:`Vouch` the cli makes from
  :mod:`builder.supply.verify` (the supply chain is a layer above the image build).

Any other image under the content tag is built again (and said, in one line), and its tag is
replaced by the push: never re-tagged, signed or run.

Example:
    >>> record("localhost:5000/ml-runtime:cpu-0123456789ab", "sha256:aa")  # doctest: +SKIP
    >>> tested("localhost:5000/ml-runtime:cpu-0123456789ab", "sha256:aa", None)  # doctest: +SKIP
    True
"""

from __future__ import annotations

from typing import Protocol

from builder.config.ownership import Ledger
from builder.oci import registry

#: The ledger of ``<content tag>@<digest>`` the builder pushed after a passed smoke test.
LEDGER = "tested"


class Vouch(Protocol):
    """Whether *image* (``<repository>@sha256:...``) carries a cosign signature by a configured key."""

    def __call__(self, image: str) -> bool: ...


def record(content_tag: str, digest: str) -> None:
    """The image *digest*, pushed under *content_tag*, passed its smoke test."""
    Ledger(LEDGER).record(f"{content_tag}@{digest}")


def recorded(content_tag: str, digest: str) -> bool:
    return f"{content_tag}@{digest}" in Ledger(LEDGER).records()


def tested(content_tag: str, digest: str, vouch: Vouch | None) -> bool:
    """Whether the registry's image *digest* under *content_tag* counts as smoke-tested (module docstring)."""
    if recorded(content_tag, digest):
        return True
    return vouch is not None and vouch(f"{registry.Ref.parse(content_tag).name}@{digest}")


def untested_note(content_tag: str, digest: str) -> str:
    """The line a view built again for this reason gets."""
    return (f"{content_tag} in the registry ({digest[:19]}...) was neither smoke-tested by this builder nor "
            "signed with your key: building it again")
