"""The container engine behind one interface: :class:`Engine` (a Protocol: every request the builder
makes of an engine), the types it answers in (:class:`ImageFacts`, :class:`EngineFacts`, :class:`DiskUsage`,
:class:`CacheRecord`, :class:`Lacks`) and is asked in (:class:`BuildRequest`), the errors it raises
(:class:`EngineError` and its subclasses), and the choice of engine by name. The engines implement it
side by side: :mod:`builder.oci.docker` (Docker, through docker-py and ``docker buildx``) and
:mod:`builder.oci.podman` (podman, through its Docker-compatible API and the podman CLI);
:mod:`builder.oci.connect` finds one.

Example:
    >>> engine_version("26.1.5+dfsg1")
    (26, 1)
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from builder.config.errors import UserError

#: Builds stream for minutes; the default 60 s read timeout would cut them off.
TIMEOUT_S = 3600

#: The engines builder drives, in the order it tries them when none is chosen (RamaLama's order, reversed:
#: docker first, as the existing hosts and CI have it).
ENGINES = ("docker", "podman")
#: The environment variable that chooses one (``--engine`` beats it).
ENGINE_VAR = "BUILDER_ENGINE"


def chosen_engine(value: str | None = None) -> str | None:
    """``docker`` or ``podman`` when *value* (``--engine``), else BUILDER_ENGINE, names one; None: whichever
    answers.

    Example:
        >>> chosen_engine("podman")
        'podman'
    """
    value = (value or os.environ.get(ENGINE_VAR, "")).strip().lower()
    if value and value not in ENGINES:
        raise UserError(f"{ENGINE_VAR}={value!r} names no engine; use one of: {', '.join(ENGINES)}")
    return value or None


def engine_version(version: str) -> tuple[int, int]:
    """``26.1.5+dfsg1`` -> (26, 1); unparsable -> (0, 0).

    Example:
        >>> engine_version("26.1.5+dfsg1")
        (26, 1)
    """
    parts = re.findall(r"\d+", version)[:2]
    return (int(parts[0]), int(parts[1]) if len(parts) > 1 else 0) if parts else (0, 0)


@dataclass(frozen=True)
class BuildRequest:
    """One image build, as data: what ``builder print`` and the bake file show, and what each engine's builder
    runs (:func:`builder.oci.buildkit.argv`, :func:`builder.oci.buildah.argv`: every value its own argument,
    no shell)."""

    dockerfile: str
    context: str
    platform: str
    build_args: dict[str, str] = field(default_factory=dict)
    #: named contexts (``RUN --mount=from=NAME``): name -> a folder, or an image of the engine's store
    #: (``docker-image://<ref>``: :mod:`builder.oci.contextimages`)
    contexts: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    stage: str | None = None
    cache_from: tuple[str, ...] = ()
    cache_to: tuple[str, ...] = ()
    no_cache: bool = False
    #: the buildx builder (None: BUILDX_BUILDER, else the engine's own)
    builder: str | None = None
    #: the image store's output; compression is honoured by BuildKit's image exporter (the
    #: containerd store, a remote builder), not by the classic store's
    compression: str = "gzip"
    tags: tuple[str, ...] = ()
    #: the stages exported beside the build, nothing stored, each once its first step runs (the
    #: wheel layers': BuildKit compresses each layer while the steps above it run, and the image's
    #: export finds them done). Honoured where the image's layers are compressed as built (BuildKit
    #: with the containerd store or a remote builder), not by the classic store or podman; the
    #: executor asks for them only where the wheels' contexts are images.
    early_stages: tuple[str, ...] = ()


@dataclass
class BuildResult:
    """What a finished build made: the image's names, its steps and how many were cached.

    The engine's ID for an image differs by store: the manifest digest in the containerd store,
    the config digest in the classic one; *ids* holds both, in that order (see :meth:`Engine.resolve`).
    """

    ids: tuple[str, ...]
    steps: int
    cached: int
    #: the registry caches BuildKit read (its "importing cache manifest from REF" steps)
    cache_read: tuple[str, ...] = ()
    #: where the build's time went: BuildKit's own seconds per phase (:class:`builder.oci.buildevents.Phases`)
    phases: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineFacts:
    """What the engine says of itself (its ``version`` and ``info``): what ``builder doctor`` and ``builder run``
    ask of it."""

    #: how a message names it: ``Docker``, ``podman``
    product: str
    #: its release (``26.1.5+dfsg1``, ``4.3.1``)
    version: str
    api_version: str = "?"
    #: ``containerd`` or ``classic``: whether it keeps an image's layers compressed as built (the containerd
    #: image store keeps zstd; the classic store, and podman's storage, keep them uncompressed)
    store: str = "classic"
    #: its storage driver (``overlayfs``, ``overlay2``, ``overlay``)
    driver: str = "?"
    #: the folder it keeps images in (Docker's data-root, podman's graphroot)
    root: str = ""
    #: the container runtimes it knows (``runc``, ``nvidia``)
    runtimes: tuple[str, ...] = ()
    #: where it reads CDI specs; empty where it reads none (CDI off, or a release before CDI)
    cdi_spec_dirs: tuple[str, ...] = ()
    #: what its builds run on: ``docker buildx`` (BuildKit) or ``podman build`` (buildah)
    builds_with: str = "docker buildx"
    #: whether it compresses layers at push (podman: its storage keeps them uncompressed), not at build
    compresses_at_push: bool = False
    #: whether it gives GPUs by CDI name only (podman: its ``--gpus`` is a no-op before 5, a CDI name from 5.0)
    gpus_by_cdi_only: bool = False
    #: how to free its disk, or move what it keeps to a larger one
    disk_fix: str = ""


@dataclass(frozen=True)
class ImageFacts:
    """An image as the engine knows it (its ``inspect``, or a row of its disk usage)."""

    #: the engine's ID (``sha256:...``: the manifest digest on the containerd store, the config digest on others)
    id: str
    #: its ``repo:tag`` names
    tags: tuple[str, ...] = ()
    #: its ``repo@sha256:...`` names: every registry the engine pushed it to or pulled it from
    digests: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    #: its layers' diff IDs, base first
    layers: tuple[str, ...] = ()
    architecture: str = ""
    #: bytes: the engine's own figure (in a disk-usage row, with what it shares with other images)
    size: int = 0
    #: bytes it shares with other images (a disk-usage row's; 0 from ``inspect``)
    shared_size: int = 0
    #: the containers that use it (a disk-usage row's; 0 from ``inspect``)
    containers: int = 0


@dataclass(frozen=True)
class CacheRecord:
    """One record of the engine's build cache (BuildKit's; podman keeps none apart from its images)."""

    id: str
    #: ``source.local`` (a local context's copy), ``regular``, ``exec.cachemount``, ...
    type: str = ""
    #: ``local source for wheels-torch``, ``mount / from exec ...``
    description: str = ""
    size: int = 0
    shared: bool = False
    in_use: bool = False
    #: when a build last used it (the engine's timestamp), None when never
    last_used: str | None = None
    usage_count: int = 0


@dataclass(frozen=True)
class DiskUsage:
    """What the engine's stores hold (its ``system df``): the images, and the build cache."""

    images: tuple[ImageFacts, ...] = ()
    build_cache: tuple[CacheRecord, ...] = ()


@dataclass(frozen=True)
class Lacks:
    """What an engine does not do that builds on the others do (``builder doctor`` lists it), and what would."""

    items: tuple[str, ...] = ()
    fix: str = ""


class EngineError(Exception):
    """The engine refused a request; the text is the engine's own explanation (one line). Its subclasses say
    which kind of refusal: :class:`ContainerTimeout`, :class:`PushFailed`, :class:`ImageUnknown`."""


class ContainerTimeout(EngineError):
    """A container still ran when its time was up (it was removed)."""


class PushFailed(EngineError):
    """A push failed, or the registry holds another digest than the engine pushed; the text says which, and the
    fix (the target fails; the run goes on with the others)."""


class ImageUnknown(EngineError):
    """The engine knows none of the names a build just made: the build ran on another engine than the one asked
    (a buildx builder on another daemon, podman storage of another user)."""


class Engine(Protocol):
    """Every request the builder makes of a container engine, in one place (repo2docker's
    ``ContainerEngine``, RamaLama's engine: the model). :class:`~builder.oci.docker.DockerEngine` and
    :class:`~builder.oci.podman.PodmanEngine` implement it, side by side. Callers take an ``Engine`` and
    never a client of one engine; the unit tests' stand-ins are checked against this Protocol by mypy.

    Images are named as the engine names them (``repo:tag``, ``repo@sha256:...`` or an ID); answers are
    this module's types, never one engine's raw ones. Requests the engine refuses raise :class:`EngineError`
    with its words (or the subclass a method names), and an engine that does not answer raises what its
    client raises (:mod:`builder.oci.faults` says either in one line).
    """

    def name(self) -> str:
        """Which engine: ``docker`` or ``podman`` (:data:`ENGINES`), for messages and ``builder doctor``."""
        ...

    def address(self) -> str:
        """Where the engine listens (``unix:///var/run/docker.sock``), for messages."""
        ...

    def store_key(self) -> str:
        """What the builder files its records of this engine's images and build cache under
        (:func:`builder.gc.owned.engine_key`): the same from every process that reaches the same store."""
        ...

    def label(self) -> tuple[str, str]:
        """How a message names this engine (``Docker engine at unix:///var/run/docker.sock``), and the command
        that checks it (``docker info``)."""
        ...

    def version(self) -> str:
        """The engine's release (``26.1.5+dfsg1``, ``4.3.1``): one request, what :func:`engine_version` reads."""
        ...

    def info(self) -> EngineFacts:
        """What the engine says of itself: its release and API, image store, storage, runtimes, CDI folders."""
        ...

    def lacks(self) -> Lacks:
        """What this engine (this release of it) does not do that builds on the others do, and what would."""
        ...

    def store(self) -> str:
        """``containerd`` or ``classic``: :attr:`EngineFacts.store`."""
        ...

    def image(self, ref: str) -> ImageFacts | None:
        """The engine's facts of an image, or None when it has no image of that name."""
        ...

    def resolve(self, names: Sequence[str]) -> str:
        """The engine's ID of an image a build named by several digests: the containerd store names an image
        by its manifest digest, the classic store by its config digest; the first one the engine knows, else
        :class:`ImageUnknown`."""
        ...

    def tag(self, image: str, ref: str) -> None:
        """Point *ref* (``repo:tag``) at *image*, moving it from whatever it named."""
        ...

    def size(self, image: str) -> int:
        """The image's unpacked size in bytes."""
        ...

    def labels(self, image: str) -> dict[str, str]:
        """The labels of the image's config."""
        ...

    def repo_digests(self, ref: str) -> list[str]:
        """``repo@sha256:...`` of every registry the engine pushed the image to or pulled it from."""
        ...

    def pull(self, ref: str, creds: dict[str, str] | None = None, *, platform: str | None = None) -> None:
        """Pull *ref* (``repo:tag`` or ``repo@sha256:...``), of *platform* when given."""
        ...

    def push(self, ref: str, compression: str = "gzip") -> str:
        """Push one tag; return the manifest digest the registry reports for it, checked against the engine's
        (else :class:`PushFailed`). *compression* is the target's: an engine that compresses at push (podman)
        uses it; one whose build compressed the layers already (BuildKit's exporter) pushes them as they are."""
        ...

    def save(self, ref: str) -> Iterator[bytes]:
        """The image as a docker-archive (``docker save``), in chunks."""
        ...

    def load(self, archive: Path | Iterable[bytes]) -> None:
        """Load a docker-archive (a file, or its bytes in chunks, streamed); a load the engine refuses
        raises :class:`EngineError`."""
        ...

    def serves_image_contexts(self, builder: str | None) -> bool:
        """Whether builds on *builder* (None: the engine's own) read a named context that is an image of
        this engine's store in place (``docker-image://``), with nothing sent or copied per build
        (:mod:`builder.oci.contextimages`); else a folder is the context."""
        ...

    def remove_image(self, ref: str) -> str | None:
        """Remove an image (or this one of its tags); None when it is gone, else why it was kept."""
        ...

    def disk_usage(self) -> DiskUsage:
        """What the engine's stores hold (``system df``): every image and build-cache record, with their sizes."""
        ...

    def build_cache(self) -> list[CacheRecord]:
        """The build-cache records of :meth:`disk_usage` alone, without measuring images: what a build reads
        before and after itself."""
        ...

    def prune_build_cache(self, record: str) -> str | None:
        """Remove one build-cache record by ID; None when done, else why not."""
        ...

    def build(
        self,
        request: BuildRequest,
        *,
        on_step: Callable[[int, int, str], None] = ...,
        on_log: Callable[[str], None] = ...,
        cancel: threading.Event | None = None,
        registry_host: str | None = None,
        cwd: Path | None = None,
    ) -> tuple[str, BuildResult]:
        """Run one build; return the engine's ID of the image it made, and the result. A build that fails (a
        step of its Dockerfile) raises ``TargetFailed`` with the builder's error: the target's failure, not the
        engine's; an image the engine then does not know, :class:`ImageUnknown`."""
        ...

    def run(self, image: str, command: Sequence[str], *, labels: Mapping[str, str], timeout: int,
            **options: Any) -> tuple[int, str, str]:
        """Run a container to completion; return (exit status, stdout and stderr merged, stdout). Always
        removes it; still running after *timeout* seconds raises :class:`ContainerTimeout`. *options* are
        the container's settings (``network_mode``, ``devices``, ``device_requests``, ``environment``,
        ``tmpfs``, ``shm_size``: the engine API's names)."""
        ...

    def create(self, options: Mapping[str, Any]) -> str:
        """Create a container (the engine API's settings, ``image`` and ``command`` among them); return its ID."""
        ...

    def attach(self, container: str) -> Iterator[tuple[bytes | None, bytes | None]]:
        """(stdout, stderr) chunks of a created container, from its first byte (attach before start)."""
        ...

    def start(self, container: str) -> None:
        """Start a created container."""
        ...

    def wait(self, container: str) -> int:
        """Wait for the container to exit; its exit status."""
        ...

    def stop(self, container: str, timeout: int) -> None:
        """Stop it (TERM, then KILL after *timeout* seconds); one gone already is no error."""
        ...

    def containers(self, label: str) -> list[str]:
        """The IDs of every container, running or not, carrying *label* (``key=value``)."""
        ...

    def container_labels(self, label: str) -> dict[str, dict[str, str]]:
        """{ID: its labels} of every container, running or not, carrying *label* (``key`` or ``key=value``)."""
        ...

    def remove_container(self, container: str) -> None:
        """Force-remove a container; one gone already, or being removed, is no error."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


