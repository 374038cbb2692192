"""The tag scheme: every name the builder gives an image, in one place.

A target's image goes by ``<repository>:<tag>``, where the repository is ``matrix.yaml``'s ``registry``
(``host[:port]/name``):

- its generated tags ``<target>`` and ``<target>-torch<version>``, and the moving alias
  ``latest-<vendor>`` on the vendor's newest target (:func:`generated`), then the tags it lists itself;
- a multi-platform target's platform tags ``<tag>-<arch>`` (:func:`platform_tag`: its own tags
  become an index of them);
- the content tag ``<target>-<12 hex>`` (:func:`content_tag`; :mod:`builder.images.content` computes
  the digest of what determines the image), applied only after a passed smoke test;
- its BuildKit cache ``buildcache-<target>-<arch>`` (:func:`cache_tag`);
- the base, ``<registry>/base:<suite>-<arch>`` until it is pinned by digest (``<registry>/base@sha256:...``;
  :func:`base_repository`, :func:`base_tag`).

Example:
    >>> generated("cpu", "2.13.0", "cpu", latest=True)
    ['cpu', 'cpu-torch2.13.0', 'latest-cpu']
    >>> content_tag("localhost:5000/ml-runtime", "cpu", "0123456789abcdef" * 4)
    'localhost:5000/ml-runtime:cpu-0123456789ab'
    >>> is_alias("localhost:5000/ml-runtime:latest-cpu"), tag_of("localhost:5000/ml-runtime:cpu")
    (True, 'cpu')
    >>> base_tag("localhost:5000/ml-runtime", "bookworm", "arm64")
    'localhost:5000/ml-runtime/base:bookworm-arm64'
"""

from __future__ import annotations

#: The moving alias's prefix: ``latest-<vendor>``.
ALIAS = "latest-"
#: Hex digits of the digest in a content tag (48 bits: collisions among one target's versions are not a concern).
CONTENT_HEX = 12


def repository_of(ref: str) -> str:
    """``<repository>`` of ``<repository>:<tag>`` (a registry's port is no tag)."""
    return ref.rsplit(":", 1)[0]


def tag_of(ref: str) -> str:
    """``<tag>`` of ``<repository>:<tag>``."""
    return ref.rsplit(":", 1)[1]


def generated(target: str, torch: str, vendor: str, *, latest: bool) -> list[str]:
    """The tags every target gets: its name, its name with its torch version, and with *latest* (it is
    the vendor's newest target) the vendor's moving alias."""
    return [target, f"{target}-torch{torch}", *([f"{ALIAS}{vendor}"] if latest else [])]


def is_alias(ref: str) -> bool:
    """Whether *ref* is a moving alias (pushed only after the versioned tags)."""
    return tag_of(ref).startswith(ALIAS)


def platform_tag(ref: str, arch: str) -> str:
    """A multi-platform target's own tag *ref* for one platform's image."""
    return f"{ref}-{arch}"


def content_tag(repository: str, target: str, digest: str) -> str:
    """The tag of this exact content of *target* (*digest*: the hex of its content's sha256)."""
    return f"{repository}:{target}-{digest[:CONTENT_HEX]}"


def cache_tag(repository: str, target: str, arch: str) -> str:
    """Where ``--push`` keeps a target's BuildKit cache for one platform: a tag beside its images."""
    return f"{repository}:buildcache-{target}-{arch}"


def base_repository(registry: str) -> str:
    """The repository of the shared base, beside the targets' images."""
    return f"{registry}/base"


def base_tag(registry: str, suite: str, arch: str) -> str:
    """The base's tag before it is pinned by digest: what it is pushed under, and what an unpinned
    render (``--allow-unpinned``) builds FROM."""
    return f"{base_repository(registry)}:{suite}-{arch}"
