"""The image commands: ``render``, ``print``, ``matrix``, ``lint``, ``base``, ``lock``, ``build``,
``smoke``, ``push``, ``bake`` and ``gc``. Each is a thin layer over one module of :mod:`builder.images`
(or the resolved config, :mod:`builder.config.project`), imported when the command runs.

Example:
    $ builder render --check
    $ builder build -t cpu --json
    $ builder bake --print -t cpu       # the docker-bake.json definition on stdout
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import click

from builder.cli.options import (
    connect_engine,
    engine_option,
    platform_option,
    project_options,
    sign_key_option,
    target_option,
)
from builder.config.errors import UserError
from builder.config.project import Project

#: The GitHub-hosted runner of each platform: every platform builds natively on CI.
RUNNERS = {"linux/amd64": "ubuntu-24.04", "linux/arm64": "ubuntu-24.04-arm"}


@click.command("render")
@project_options
@target_option
@click.option("--check", is_flag=True, help="Exit 1 if images/ differs from a fresh render; write nothing.")
def render_cmd(project: Project, targets: tuple[str, ...], check: bool) -> None:
    """Write images/<target>/Dockerfile for each target (atomically)."""
    from builder.images import render

    selected = project.select(targets, group="all")
    if check:
        diff = render.check(project, selected if targets else project.targets)
        if diff:
            sys.stdout.writelines(diff)
            click.echo("images/ is stale: run 'builder render' and commit the result", err=True)
            sys.exit(1)
        click.echo(f"images/ is up to date ({len(selected)} targets)")
        return
    changed = render.write(render.render(project, selected))
    for path in changed:
        click.echo(f"wrote {path.relative_to(project.root)}")
    if not targets:
        for folder in render.stale_folders(project):
            click.echo(f"note: {folder.relative_to(project.root)}/ belongs to no target; delete it", err=True)
    if not changed:
        click.echo(f"images/ already up to date ({len(selected)} targets)")


@click.command("print")
@project_options
@target_option
@click.option("--schema", is_flag=True, help="Print the JSON Schema of this output instead (docs/print.schema.json).")
def print_cmd(project: Project, targets: tuple[str, ...], schema: bool) -> None:
    """Print the fully resolved configuration as JSON, without building (like bake --print).

    Each target's content_tags give, per platform, the tag its image gets once built and
    smoke-tested: a digest of everything that goes into it (see builder/images/content.py); its
    layers, per platform, the layer plan: each layer's locked wheels, in install order (an empty
    list until the platform is locked; see builder/wheels/layers.py); its plan, per platform, the
    build's plan (builder/images/plan.py): references, build arguments, contexts, cache, and the
    stages a plain build runs. The model is builder/images/printed.py; its schema, docs/print.schema.json.
    """
    from builder.images import printed

    if schema:
        click.echo(json.dumps(printed.schema(), indent=2))
        return
    selected = project.select(targets) if targets else project.targets
    click.echo(printed.show(project, selected).model_dump_json(indent=2))


@click.command("matrix")
@project_options
@click.option("--format", "fmt", type=click.Choice(["json", "github"]), default="json", show_default=True,
              help="json: a list of targets; github: {'include': [...]} for strategy.matrix via fromJSON.")
@click.option("--group", default="default", show_default=True, help="Which group of targets.")
@click.option("--changed", is_flag=True,
              help="Only targets the registry lacks as tested: no content tag there, or one on a digest "
              "neither this builder pushed after its smoke test nor signed with BUILDER_VERIFY_KEY's key "
              "(one manifest request each): an unchanged target needs no runner.")
@platform_option
def matrix_cmd(project: Project, fmt: str, group: str, changed: bool, platforms: tuple[str, ...]) -> None:
    """Print the targets of a group for a CI matrix: one row per target and platform, with the
    GitHub runner of that architecture (no emulation on CI)."""
    from builder.images.content import content_tags
    from builder.oci import registry

    try:
        names = project.matrix.group(group)
    except KeyError:
        raise UserError(f"--group: unknown group {group!r} (known: default, all, {', '.join(project.matrix.groups)})")
    selected = project.views(names, platforms)
    tags = content_tags(project, selected)
    if changed:
        from builder.images import trust

        host = project.matrix.registry.split("/", 1)[0]
        creds, vouch = registry.credentials(host), _vouch(None)
        up = registry.ping(host, timeout=3.0)

        def reusable(tag: str) -> bool:  # what builder build would reuse: a digest tested or signed (trust)
            digest = registry.manifest_digest(tag, creds)
            return digest is not None and trust.tested(tag, digest, vouch)

        selected = [t for t in selected if not up or not reusable(tags[t.unit])]
    rows = [
        {"target": t.name, "platform": t.platform, "runner": RUNNERS[t.platform], "backend": t.backend,
         "vendor": t.vendor, "torch": t.torch_pin, "tags": t.tags, "content_tag": tags[t.unit]}
        for t in selected
    ]
    click.echo(json.dumps({"include": rows} if fmt == "github" else rows, separators=(",", ":")))


@click.command("lint")
@project_options
@target_option
def lint_cmd(project: Project, targets: tuple[str, ...]) -> None:
    """Run hadolint on the rendered Dockerfiles (failure threshold: warning)."""
    from builder.images import lint

    problems = lint.lint(project, project.select(targets, group="all"))
    for line in problems:
        click.echo(line)
    if problems:
        sys.exit(1)
    click.echo("hadolint: clean")


@click.command("base")
@engine_option
@project_options(pinned=False)
@click.option("--check", is_flag=True, help="Bootstrap afresh and say whether base.lock.json still matches (exit 1 if not).")
@click.option("--update", is_flag=True, help="Re-pin when a fresh bootstrap differs from the lock (mirror moved).")
@platform_option
def base_cmd(project: Project, check: bool, update: bool, platforms: tuple[str, ...], engine_choice: str | None) -> None:
    """Make (or reuse), push and pin the shared base in base.lock.json, per platform.

    Default: every platform a target lists (a foreign one bootstraps under qemu emulation).
    """
    from builder.base import pin

    wanted = list(platforms) or list(project.base_refs)
    if check:
        sys.exit(0 if pin.check(project, wanted, say=click.echo) else 1)
    engine = connect_engine(engine_choice)
    for platform in wanted:
        reference = pin.get(engine, project, platform, need="published", update=update, say=click.echo)
        click.echo(f"base {platform}: {reference} (image {pin.image_id(engine, project, platform)})")


@click.command("lock")
@project_options
@target_option
@platform_option
def lock_cmd(project: Project, targets: tuple[str, ...], platforms: tuple[str, ...]) -> None:
    """Resolve wheels on the host into the wheelhouse and write the hash locks, per platform."""
    from builder.wheels import locks

    failed = locks.lock_all(project, project.views(targets, platforms), click.echo)
    for name, error in failed.items():
        click.echo(f"{name}: {error}", err=True)
    sys.exit(1 if failed else 0)


def _report(outcomes: list[Any], as_json: bool) -> None:
    from builder.images.progress import print_summary

    if as_json:
        keys = ("target", "platform", "result", "content_tag", "tags", "image_id", "size_bytes", "seconds", "smoke",
                "notes", "steps", "cached_steps", "cache_read", "phases", "digest", "error")
        click.echo(json.dumps([{k: o.as_dict()[k] for k in keys} for o in outcomes], indent=2))
    else:
        print_summary(outcomes)
    if any(o.error for o in outcomes):
        sys.exit(1)


@click.command("build")
@engine_option
@project_options(pinned=False)
@target_option
@click.option("--push", is_flag=True, help="Push every tag after the smoke test passes (aliases last).")
@click.option("--keep-going", "-k", is_flag=True, help="A failing target doesn't stop the others.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON on stdout.")
@click.option("--jobs", "-j", default=1, show_default=True, type=click.IntRange(1, 16),
              help="Targets built concurrently; the shared stage is built once first.")
@click.option("--no-smoke", is_flag=True, help="Skip the smoke test (the result says 'skipped').")
@click.option("--quiet", "-q", is_flag=True, help="Progress bars only, no build log.")
@click.option("--rebuild", is_flag=True,
              help="Build and smoke-test even when the content tag exists, without the layer cache.")
@click.option("--pull", is_flag=True,
              help="Pull a target the registry already has under its content tag (default: skip it).")
@click.option("--update-base", is_flag=True,
              help="When the base must be bootstrapped and the Debian mirror moved, re-pin it (builder base --update).")
@click.option("--builder", "buildx_builder", default=None, metavar="NAME",
              help="The buildx builder to build on (a remote BuildKit, a Kubernetes-driver farm); default: "
              "BUILDX_BUILDER, else the engine's own. Smoke tests and pushes use DOCKER_HOST's engine.")
@platform_option
@sign_key_option
def build_cmd(project: Project, targets: tuple[str, ...], push: bool, keep_going: bool, as_json: bool,
              jobs: int, no_smoke: bool, quiet: bool, rebuild: bool, pull: bool, update_base: bool,
              buildx_builder: str | None, platforms: tuple[str, ...], sign_key: str | None,
              engine_choice: str | None) -> None:
    """Build (BuildKit), smoke-test, tag (and push) targets.

    A target whose content tag (<registry>:<target>-<12 hex>, a digest of everything that goes
    into its image) exists locally, or in the registry on a digest this builder pushed after a
    passed smoke test or one signed with your key (--sign-key, BUILDER_VERIFY_KEY), was built and
    tested already: only its tags move; any other image under it is built again. --json says per
    target and platform: built, reused-local or reused-registry.
    Each platform a target lists is built (a foreign one under qemu emulation); with --push, a
    target with several platforms gets one index under each of its tags, and with a signing key
    every pushed image gets its signature, SBOM and provenance attached (see builder verify).
    """
    from builder.images.build import build_all
    from builder.images.progress import Progress

    signer = _signer(sign_key, push)
    # buildx reads BUILDX_BUILDER itself; --builder goes to each build as its own argument
    buildx_builder = buildx_builder or os.environ.get("BUILDX_BUILDER") or None
    engine = connect_engine(engine_choice)
    if buildx_builder:
        from builder.oci.buildkit import builder_problem

        if (problem := builder_problem(buildx_builder, engine.address())) is not None:
            raise UserError(problem)
    views = project.views(targets, platforms)
    if push:
        from builder.oci.localregistry import ensure_local

        started = ensure_local(project.matrix.registry.split("/", 1)[0])
        if started:
            click.echo(started, err=True)
    attest = _attester(project, signer, lambda line: click.echo(line, err=True)) if push else None
    with Progress(verbose=not quiet) as ui:
        outcomes = build_all(engine, project, views, ui, push=push, smoke=not no_smoke, keep_going=keep_going,
                             jobs=jobs, rebuild=rebuild, pull=pull, update_base=update_base, attest=attest,
                             vouch=_vouch(signer), builder=buildx_builder)
    _report(outcomes, as_json)


def _signer(sign_key: str | None, push: bool) -> Any:
    """The signer of --sign-key or $BUILDER_SIGNING_KEY (checked before anything is built), or None.

    The signing modules are imported only when there is a key: a no-op build stays fast.
    """
    import os

    if not sign_key and not os.environ.get("BUILDER_SIGNING_KEY"):
        if push:
            click.echo("note: no signing key (--sign-key or BUILDER_SIGNING_KEY): pushed images get no signature, "
                       "SBOM or provenance", err=True)
        return None
    if not push:
        click.echo("note: --sign-key signs what is pushed: add --push", err=True)
    from builder.supply.signing import load_signer

    return load_signer(sign_key)


def _attester(project: Project, signer: Any, say: Any) -> Any:
    """The executor's ``attest`` stage (:class:`builder.supply.attach.Attach`) for *signer*, or None:
    the supply chain is a layer above the image build, so it is handed in from here."""
    if signer is None:
        return None
    from builder.supply.attach import Attach

    return Attach(project, signer, say)


def _vouch(signer: Any) -> Any:
    """Whether an image found in a registry under a content tag is signed with a configured key: the
    signing key's public key, and BUILDER_VERIFY_KEY's (:mod:`builder.images.trust`); None without either."""
    import os

    keys = [signer.public_key] if signer is not None else []
    if os.environ.get("BUILDER_VERIFY_KEY"):
        from builder.supply.signing import load_public_key

        keys.append(load_public_key(None))
    if not keys:
        return None
    from builder.supply.verify import signed

    return lambda image: signed(image, keys)


@click.command("smoke")
@engine_option
@project_options
@target_option
@platform_option
@click.option("--no-train", is_flag=True, help="Skip the 2-process accelerate training run.")
def smoke_cmd(project: Project, targets: tuple[str, ...], platforms: tuple[str, ...], no_train: bool,
              engine_choice: str | None) -> None:
    """Smoke-test the tagged images of targets, per platform (build them first)."""
    from builder.images.smoke import smoke_test

    engine = connect_engine(engine_choice)
    failed = False
    for view in project.views(targets, platforms):
        ref = view.local_refs[0]
        if engine.image(ref) is None:
            click.echo(f"{view.unit}: SKIPPED (no image {ref}; run 'builder build -t {view.name} "
                       f"--platform {view.platform}')")
            continue
        result = smoke_test(engine, project, view, ref, train=not no_train, log=click.echo)
        for line in result.skipped:
            click.echo(f"{view.unit}: {line}")
        click.echo(f"{view.unit}: {result.status.upper()} ({result.summary()})")
        failed |= result.status == "failed"
    sys.exit(1 if failed else 0)


@click.command("push")
@engine_option
@project_options
@target_option
@platform_option
@sign_key_option
def push_cmd(project: Project, targets: tuple[str, ...], platforms: tuple[str, ...], sign_key: str | None,
             engine_choice: str | None) -> None:
    """Push already-built targets (versioned tags first, then latest-<vendor>); a target with
    several platforms pushes each platform's image, then one index under each of its tags.
    With a signing key, each pushed image gets its signature, SBOM and provenance attached."""
    from builder.config.files import published_path
    from builder.images.build import push_all

    signer = _signer(sign_key, True)
    engine = connect_engine(engine_choice)
    attest = _attester(project, signer, click.echo)
    views = project.views(targets, platforms)
    report = _PushReport(views)
    outcomes = push_all(engine, project, views, report, attest=attest)
    if any(o.digest for o in outcomes):
        click.echo(f"published manifest: {published_path(project.root)}")
    for o in outcomes:  # what went wrong after its line was printed: the target's index
        if o.error and (o.target, o.platform) not in report.failed:
            click.echo(f"{o.target}: {o.error}", err=True)
    sys.exit(1 if any(o.error for o in outcomes) else 0)


class _PushReport:
    """``builder push``'s report, a line per view as it is done (the executor's UI)."""

    def __init__(self, views: Any) -> None:
        self.refs = {v.unit: v.local_refs[0] for v in views}
        self.failed: set[tuple[str, str | None]] = set()  # (target, platform) of the errors said

    def start(self, target: str) -> None:
        pass

    def step(self, target: str, n: int, total: int, text: str) -> None:
        pass

    def log(self, target: str, line: str) -> None:
        pass

    def say(self, text: str) -> None:
        click.echo(text)

    def done(self, target: str, outcome: Any) -> None:
        if outcome.error:
            self.failed.add((outcome.target, outcome.platform))
            click.echo(f"{target}: {outcome.error}", err=True)
            return
        tested = "" if outcome.smoke != "skipped" else " (no smoke-tested content tag here: the content tag is not pushed)"
        click.echo(f"{target}: pushed {self.refs[target].rsplit(':', 1)[0]}@{outcome.digest}{tested}")


@click.command("bake")
@project_options
@target_option
@click.option("--output", "-o", "output", default=None, type=click.Path(dir_okay=False),
              help="Where to write it (default: docker-bake.json beside the matrix).")
@click.option("--print", "to_stdout", is_flag=True, help="Print the definition on stdout instead of writing it.")
def bake_cmd(project: Project, targets: tuple[str, ...], output: str | None, to_stdout: bool) -> None:
    """Write the matrix as a docker-bake.json (targets, tags, labels, groups, registry cache)."""
    from builder.config.files import atomic_write
    from builder.images.bake import bake_definition, stage_contexts

    selected = project.select(targets, group="all")
    text = json.dumps(bake_definition(project, selected), indent=2) + "\n"
    if to_stdout:
        click.echo(text, nl=False)
        return
    failed = stage_contexts(project, selected, click.echo)
    path = Path(output) if output else project.root / "docker-bake.json"
    atomic_write(path, text)
    click.echo(f"wrote {path}; build with: docker buildx bake -f {path.name} <target>")
    for unit, error in failed.items():
        click.echo(f"{unit}: its wheels are not staged, so bake can't build it: {error}", err=True)
    if failed:
        sys.exit(1)


@click.command("gc")
@engine_option
@project_options
@click.option("--dry-run", is_flag=True, help="List what would go and how much; remove nothing.")
@click.option("--keep-days", default=7, show_default=True, type=click.FloatRange(0),
              help="Keep wheels, staged folders, images and BuildKit copies another clone of yours used within "
              "this many days: every clone shares them (0: only this checkout counts).")
@click.option("--verbose", "-v", is_flag=True, help="A line per item under each store.")
@click.option("--json", "as_json", is_flag=True, help="Print the stores and items as JSON on stdout.")
def gc_cmd(project: Project, dry_run: bool, keep_days: float, verbose: bool, as_json: bool,
           engine_choice: str | None) -> None:
    """Remove what the builder recorded as its own and nothing still uses, store by store.

    \b
    wheelhouse:  wheels it fetched that no lock here pins, no live build holds, no other clone used in --keep-days; no other file.
    contexts:    folders it staged that no target here names, no live build holds, no other clone used in --keep-days.
    build cache: BuildKit copies of wheel contexts our builds made or used, superseded here; never one in use, another clone's (--keep-days).
    images:      images our builds made, not current here; never a live build's, another clone's (--keep-days), one a container uses or a file names by digest.
    registry:    unreferenced blobs of the builder's own loopback registry, only with it stopped and no build on it.
    Smoke containers are the next build's to remove: those of killed runs (their lease is free), no others.

    Exits 1 when something listed could not be removed (a line says why).
    """
    from builder.gc import stores as gc
    from builder.images.content import current_refs

    engine = connect_engine(engine_choice)
    found = gc.collect(engine, project, keep_days=keep_days, current=current_refs(project))
    failed = [] if dry_run else gc.remove(engine, project, found, say=lambda line: click.echo(line, err=True))
    if as_json:
        click.echo(gc.as_json(found, dry_run))
    else:
        for line in gc.report_lines(found, verbose, dry_run):
            click.echo(line)
    sys.exit(1 if failed else 0)
