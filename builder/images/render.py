"""Render each target's Dockerfile from templates/ into images/<target>/.

Rendering is pure (no engine): every file is rendered in memory first, so an error leaves
images/ exactly as it was; then each file is replaced atomically. ``check`` compares the
committed images/ with a fresh render (lock files are the resolver's, not the renderer's).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2

from builder.config import grammar as g
from builder.config.errors import UserError
from builder.config.files import atomic_write
from builder.config.project import Project, Target
from builder.wheels import layers

#: Files under images/<target>/ that render owns; anything else there (locks) is left alone.
RENDERED = ("Dockerfile",)
#: Where a RUN finds its layer's wheels (`<WHEELS_MOUNT>/<layer>`, from the named build context `wheels-<layer>`).
WHEELS_MOUNT = "/tmp/wheels"


def _finalize(value: Any) -> Any:
    """Second line of defence: no interpolated value may break out of its line."""
    if isinstance(value, str) and g.FORBIDDEN_IN_DOCKERFILE.search(value):
        raise UserError(f"refusing to render {value!r}: newlines, backslashes and control characters are not allowed")
    return value


def environment(templates: Path) -> jinja2.Environment:
    """The Jinja2 environment: StrictUndefined, no autoescape (Dockerfiles are not HTML)."""
    if not (templates / "Dockerfile.j2").is_file():
        raise UserError(f"{templates}/Dockerfile.j2: template not found; run from the project folder")
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        finalize=_finalize,
    )


def render_target(env: jinja2.Environment, project: Project, target: Target) -> dict[str, str]:
    """Render one target's build files, keyed by file name.

    Example:
        >>> env = environment(project.root / "templates")
        >>> render_target(env, project, project.target("cpu"))["Dockerfile"].splitlines()[0]
        '# Rendered by `builder render` from templates/: do not edit; change matrix.yaml or templates/.'
    """
    name = f"backends/{target.backend}.j2"
    template = env.get_template(name if (project.templates_dir / name).is_file() else "Dockerfile.j2")
    context = {
        "target": target,
        "wheels": WHEELS_MOUNT,
        "epoch": project.matrix.base.source_date_epoch,
        "arg_name": layers.arg_name,
        "context_name": layers.context_name,
        "stage_name": layers.stage_name,
        "startup_imports": ", ".join(project.matrix.startup_imports),
        "startup_packages": " ".join(dict.fromkeys(m.split(".")[0] for m in project.matrix.startup_imports)),
    }
    try:
        text = template.render(context)
    except jinja2.UndefinedError as exc:
        raise UserError(f"{template.filename}: {exc.message}; the template uses a value the project does not define")
    return {"Dockerfile": text}


def render(project: Project, targets: Sequence[Target]) -> dict[Path, str]:
    """Render every selected target in memory: {path under the project: text}."""
    env = environment(project.templates_dir)
    out: dict[Path, str] = {}
    for target in targets:
        for name, text in render_target(env, project, target).items():
            out[project.images_dir / target.name / name] = text
    return out


def write(rendered: dict[Path, str]) -> list[Path]:
    """Write rendered files atomically; return those whose content changed."""
    changed = []
    for path, text in rendered.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            atomic_write(path, text)
            changed.append(path)
    return changed


def stale_folders(project: Project) -> list[Path]:
    """Folders under images/ that belong to no target any more."""
    names = {t.name for t in project.targets}
    if not project.images_dir.is_dir():
        return []
    return sorted(p for p in project.images_dir.iterdir() if p.is_dir() and p.name not in names)


def check(project: Project, targets: Sequence[Target]) -> list[str]:
    """Differences between images/ and a fresh render, as unified-diff lines (empty: up to date)."""
    lines: list[str] = []
    for path, text in render(project, targets).items():
        rel = path.relative_to(project.root)
        old = path.read_text(encoding="utf-8") if path.exists() else ""
        if old != text:
            lines += difflib.unified_diff(
                old.splitlines(keepends=True), text.splitlines(keepends=True), f"a/{rel}", f"b/{rel}"
            )
            if not old:
                lines.append(f"{rel}: missing\n")
    for folder in stale_folders(project):
        lines.append(f"{folder.relative_to(project.root)}/: no target of that name in {project.matrix_path.name}\n")
    return lines
