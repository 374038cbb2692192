"""Which matrix target runs on this host: ``builder run --target auto|T``.

The target: ``--target T``, or with ``auto`` the matrix target of the host's vendor
(:func:`builder.host.hardware.choose_vendor`); when several targets share the vendor, the one
tagged ``latest-<vendor>``; with no usable GPU (or ``--no-gpus``) the cpu target.
"""

from __future__ import annotations

from collections.abc import Mapping

from builder.config.errors import UserError
from builder.config.project import Project, Target
from builder.host import hardware


def choose_target(
    project: Project,
    requested: str = "auto",
    host: hardware.HostGpus | None = None,
    *,
    gpus: bool = True,
    environ: Mapping[str, str] | None = None,
) -> tuple[Target, str]:
    """The target to run and why (see the module docstring for the rule).

    Example:
        >>> choose_target(project, "auto", hardware.HostGpus())
        (Target(name='cpu', ...), 'no usable GPU on this host')
    """
    if requested != "auto":
        return project.target(requested), f"--target {requested}"
    if gpus:
        vendor, why = hardware.choose_vendor(host or hardware.detect(), environ)
    else:
        vendor, why = "cpu", "--no-gpus"
    candidates = [t for t in project.targets if t.vendor == vendor]
    if not candidates and vendor != "cpu":
        why += f"; {project.matrix_path.name} has no {vendor} target, so the cpu one"
        vendor, candidates = "cpu", [t for t in project.targets if t.vendor == "cpu"]
    if not candidates:
        raise UserError(
            f"{project.matrix_path.name}: no {vendor} target to run here; add one (backend: {vendor}) "
            "or pass --target T"
        )
    if len(candidates) == 1:
        return candidates[0], why
    latest = [t for t in candidates if t.alias_refs] or candidates
    return latest[
        0
    ], why + f"; {latest[0].name} carries latest-{vendor} (of {', '.join(t.name for t in candidates)})"
