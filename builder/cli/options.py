"""Options every ``builder`` command shares (kept apart so command modules can import them)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from builder.config.project import load_project
from builder.oci import registry

if TYPE_CHECKING:
    from builder.oci.engine import Engine


def _index_pairs(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, url = value.partition("=")
        if not sep or not key or not url:
            raise click.BadParameter(f"{value!r}: expected KEY=URL, e.g. rocm5.7=https://mirror.example/whl/rocm5.7")
        out[key] = url
    return out


def project_options(func: Callable[..., Any] | None = None, *, pinned: bool = True) -> Any:
    """Options every command shares: where the matrix and wheel mapping are, mirrors, pinning.

    ``pinned=False`` is for ``builder base``, which writes the pin the others need.
    """
    if func is None:
        return functools.partial(project_options, pinned=pinned)

    @click.option(
        "--matrix", "matrix_path", default="matrix.yaml", show_default=True, type=click.Path(dir_okay=False),
        help="The build matrix; its folder is the project root (templates/, images/, base.lock.json).",
    )
    @click.option(
        "--wheel-mapping", "mapping_path", default=None, type=click.Path(dir_okay=False),
        help="Wheel mapping (default: wheel-mapping.json beside the matrix).",
    )
    @click.option(
        "--index", "indexes", multiple=True, metavar="KEY=URL",
        help="Point a wheel-mapping entry at a mirror (also BUILDER_INDEX_<KEY>=URL).",
    )
    @click.option(
        "--allow-unpinned", is_flag=True, help="Accept a base not pinned by digest (never for published images).",
    )
    @functools.wraps(func)
    def wrapper(matrix_path: str, mapping_path: str | None, indexes: tuple[str, ...], allow_unpinned: bool, **kw: Any):
        project = load_project(
            matrix_path, mapping_path, allow_unpinned=allow_unpinned or not pinned,
            index_overrides=_index_pairs(indexes),
        )
        registry.use_for(project.matrix.registry)  # BUILDER_REGISTRY_* go to this registry alone
        return func(project, **kw)

    return wrapper


target_option = click.option(
    "--target", "-t", "targets", multiple=True, metavar="T",
    help="Target or group name (repeatable); default: the 'default' group.",
)

platform_option = click.option(
    "--platform", "platforms", multiple=True, metavar="OS/ARCH", type=click.Choice(["linux/amd64", "linux/arm64"]),
    help="Only this platform of each target (repeatable); default: every platform the target lists.",
)

sign_key_option = click.option(
    "--sign-key", default=None, metavar="PATH", type=click.Path(dir_okay=False),
    help="Private key cosign signs each pushed image, its SBOM and its provenance with: cosign's own "
    "(cosign generate-key-pair; password: $COSIGN_PASSWORD) or PEM (ECDSA, Ed25519, RSA; passphrase: "
    "$BUILDER_SIGNING_KEY_PASSWORD). Default: the key text in $BUILDER_SIGNING_KEY. Never printed, never "
    "passed to the engine. Without one, nothing is attached.",
)


engine_option = click.option(
    "--engine", "engine_choice", type=click.Choice(["docker", "podman"]), default=None,
    help="The container engine: docker or podman (env BUILDER_ENGINE); default: docker if it answers, else podman.",
)


@dataclass
class Session:
    """What one run of ``builder`` holds (click's ``obj``, handed to every command): the engine a command
    connected, which the CLI's fault handler names (:func:`builder.oci.faults.describe`)."""

    engine: Engine | None = None


def connect_engine(choice: str | None) -> Engine:
    """The engine *choice* names (``--engine``; None: BUILDER_ENGINE, else whichever answers), connected, and
    kept in the run's :class:`Session`."""
    from builder.oci.connect import connect

    engine = connect(kind=choice)
    ctx = click.get_current_context(silent=True)
    if ctx is not None and (session := ctx.find_object(Session)) is not None:
        session.engine = engine
    return engine
