"""Bases for the unit tests' stand-ins of the builder's Protocols (import as ``from doubles import ...``).

A stand-in extends one of these and overrides what its test uses: it is a complete implementation
of the Protocol, and mypy checks each override's signature against it (a stand-in that drifts from
:class:`builder.oci.engine.Engine` or :class:`builder.images.execute.UI` fails ``make check``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from builder.images.execute import UI
from builder.images.outcome import Outcome
from builder.oci.engine import (
    BuildRequest,
    BuildResult,
    CacheRecord,
    DiskUsage,
    Engine,
    EngineFacts,
    ImageFacts,
    Lacks,
)


def _unused(request: str) -> AssertionError:
    return AssertionError(f"not used by this test: {request}")


class NoEngine(Engine):
    """An :class:`Engine` whose every request fails the test that makes it."""

    def name(self) -> str:
        raise _unused("name")

    def address(self) -> str:
        raise _unused("address")

    def store_key(self) -> str:
        raise _unused("store_key")

    def label(self) -> tuple[str, str]:
        raise _unused("label")

    def version(self) -> str:
        raise _unused("version")

    def info(self) -> EngineFacts:
        raise _unused("info")

    def lacks(self) -> Lacks:
        raise _unused("lacks")

    def store(self) -> str:
        raise _unused("store")

    def image(self, ref: str) -> ImageFacts | None:
        raise _unused("image")

    def resolve(self, names: Sequence[str]) -> str:
        raise _unused("resolve")

    def tag(self, image: str, ref: str) -> None:
        raise _unused("tag")

    def size(self, image: str) -> int:
        raise _unused("size")

    def labels(self, image: str) -> dict[str, str]:
        raise _unused("labels")

    def repo_digests(self, ref: str) -> list[str]:
        raise _unused("repo_digests")

    def pull(self, ref: str, creds: dict[str, str] | None = None, *, platform: str | None = None) -> None:
        raise _unused("pull")

    def push(self, ref: str, compression: str = "gzip") -> str:
        raise _unused("push")

    def save(self, ref: str) -> Iterator[bytes]:
        raise _unused("save")

    def load(self, archive: Path | Iterable[bytes]) -> None:
        raise _unused("load")

    def serves_image_contexts(self, builder: str | None) -> bool:
        return False  # its builds' contexts are the staged folders

    def remove_image(self, ref: str) -> str | None:
        raise _unused("remove_image")

    def disk_usage(self) -> DiskUsage:
        raise _unused("disk_usage")

    def build_cache(self) -> list[CacheRecord]:
        raise _unused("build_cache")

    def prune_build_cache(self, record: str) -> str | None:
        raise _unused("prune_build_cache")

    def build(
        self,
        request: BuildRequest,
        *,
        on_step: Callable[[int, int, str], None] = lambda n, total, text: None,
        on_log: Callable[[str], None] = lambda line: None,
        cancel: threading.Event | None = None,
        registry_host: str | None = None,
        cwd: Path | None = None,
    ) -> tuple[str, BuildResult]:
        raise _unused("build")

    def run(self, image: str, command: Sequence[str], *, labels: Mapping[str, str], timeout: int,
            **options: Any) -> tuple[int, str, str]:
        raise _unused("run")

    def create(self, options: Mapping[str, Any]) -> str:
        raise _unused("create")

    def attach(self, container: str) -> Iterator[tuple[bytes | None, bytes | None]]:
        raise _unused("attach")

    def start(self, container: str) -> None:
        raise _unused("start")

    def wait(self, container: str) -> int:
        raise _unused("wait")

    def stop(self, container: str, timeout: int) -> None:
        raise _unused("stop")

    def containers(self, label: str) -> list[str]:
        raise _unused("containers")

    def container_labels(self, label: str) -> dict[str, dict[str, str]]:
        raise _unused("container_labels")

    def remove_container(self, container: str) -> None:
        raise _unused("remove_container")

    def close(self) -> None:
        raise _unused("close")


class Silent(UI):
    """A :class:`UI` that tells nothing."""

    def start(self, target: str) -> None: ...
    def step(self, target: str, n: int, total: int, text: str) -> None: ...
    def log(self, target: str, line: str) -> None: ...
    def done(self, target: str, outcome: Outcome) -> None: ...
    def say(self, text: str) -> None: ...
