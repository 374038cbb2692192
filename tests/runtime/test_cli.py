"""runtime-check end to end: exec really execs, strict failures stop before the command.

Subprocess tests run the runtime from source with the real torch; those that mean "no
accelerator" hide the host's (conftest.NO_ACCELERATOR), so they hold on a GPU host too. In-process
tests use recorded NVIDIA facts (fixtures/, we lack the hardware) and a stand-in for os.execvpe to
see the child's environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from ml_runtime import cli
from ml_runtime.devices.probe import build_probe

GPU_SPEC = 'required_features:\n  - gpu_compute_capability: "sm_80"\n'


def test_exec_replaces_the_checker_process(cli_env, workspace):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ml_runtime",
            "exec",
            "--",
            sys.executable,
            "-c",
            "import os; print(os.getpid())",
        ],
        env=cli_env,
        cwd=workspace,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert int(out.strip()) == proc.pid  # same PID: execvp, not a child process
    assert "[CHECK] pytorch: " in err and "-> OK" in err  # the report goes to stderr


def test_exit_status_is_the_commands(run_cli):
    result = run_cli("exec", "--", sys.executable, "-c", "import sys; sys.exit(7)")
    assert result.returncode == 7


def test_strict_failure_exits_3_and_does_not_run_the_command(run_cli, workspace, no_accelerator):
    (workspace / "runtime-spec.yaml").write_text(GPU_SPEC, encoding="utf-8")  # picked up from /workspace
    marker = workspace / "ran"
    result = run_cli("exec", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w').close()", env=no_accelerator)
    assert result.returncode == 3
    assert not marker.exists()
    assert (
        "[CHECK] gpu_compute_capability: no accelerator (CPU only) -> FAIL "
        "(requires an NVIDIA GPU (sm_80) but no accelerator was found)"
    ) in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("runtime-check: 1 of 1 checks failed: run on a host with an NVIDIA GPU of compute")
    assert last.endswith("or set RUNTIME_CHECK_MODE=warn")
    assert "Traceback" not in result.stderr


def test_warn_mode_runs_the_command(run_cli, workspace, tmp_path, no_accelerator):
    spec = tmp_path / "spec.yaml"
    spec.write_text(GPU_SPEC, encoding="utf-8")
    marker = workspace / "ran"
    code = f"open({str(marker)!r}, 'w').close()"
    result = run_cli(
        "exec",
        "--",
        sys.executable,
        "-c",
        code,
        env={**no_accelerator, "RUNTIME_SPEC": str(spec), "RUNTIME_CHECK_MODE": "warn"},
    )
    assert result.returncode == 0 and marker.exists()
    assert "-> WARN (requires an NVIDIA GPU (sm_80) but no accelerator was found)" in result.stderr
    # --mode overrides the environment
    marker.unlink()
    result = run_cli(
        "exec",
        "--mode",
        "strict",
        "--",
        sys.executable,
        "-c",
        code,
        env={**no_accelerator, "RUNTIME_SPEC": str(spec), "RUNTIME_CHECK_MODE": "warn"},
    )
    assert result.returncode == 3 and not marker.exists()


def test_mode_off_skips_everything_even_a_broken_spec(run_cli, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("required_features: [oops\n", encoding="utf-8")
    result = run_cli(
        "exec",
        "--",
        sys.executable,
        "-c",
        "print('ran')",
        env={"RUNTIME_SPEC": str(spec), "RUNTIME_CHECK_MODE": "off"},
    )
    assert result.returncode == 0 and result.stdout == "ran\n"
    assert "[CHECK] all checks skipped (mode off)" in result.stderr


def test_spec_error_is_one_line_exit_2(run_cli, tmp_path):
    (tmp_path / "runtime-spec.yaml").write_text(
        'required_features:\n  - gpu_compute_capability: "sm8"\n', encoding="utf-8"
    )
    result = run_cli("check", "--spec", "runtime-spec.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "runtime-spec.yaml: required_features[0].gpu_compute_capability: 'sm8' is not a valid compute "
        "capability (expected sm_XY, gfxNNN[a-z] or an Intel family (pvc, dg2, bmg; or Xe_HPC, Xe_HPG, Xe2_HPG) "
        "/ device id 0xNNNN)"
    )
    assert result.stdout == ""


def test_bad_mode_variable_is_exit_2(run_cli):
    result = run_cli("check", env={"RUNTIME_CHECK_MODE": "loud"})
    assert result.returncode == 2
    assert result.stderr.strip() == "RUNTIME_CHECK_MODE: 'loud' is not one of strict, warn, off"


@pytest.mark.parametrize("args", [("exec",), ("exec", "--"), ("exec", "--json", "--")])
def test_missing_command_is_a_usage_error(run_cli, args):
    result = run_cli(*args)
    assert result.returncode == 2
    assert "missing command after '--'" in result.stderr and "usage: runtime-check exec" in result.stderr


def test_command_not_found_is_127(run_cli):
    result = run_cli("exec", "--", "no-such-command-xyz", "--flag")
    assert result.returncode == 127
    assert result.stderr.strip() == "runtime-check: command not found: no-such-command-xyz"


def test_default_spec_passes_on_this_host_and_json_is_a_list(run_cli):
    result = run_cli("check", "--json")
    assert result.returncode == 0, result.stderr
    items = json.loads(result.stdout)
    assert [i["item"] for i in items] == [
        "pytorch", "pytorch.full_distribution", "pytorch.host_driver", "contract_files"]
    assert all(i["status"] == "OK" for i in items)


def test_exec_json_report_leaves_stdout_to_the_command(run_cli):
    result = run_cli("exec", "--json", "--", sys.executable, "-c", "print('hello')")
    assert result.returncode == 0
    assert result.stdout == "hello\n"
    assert json.loads(result.stderr)[0]["item"] == "pytorch"


def test_probe_json_without_an_accelerator(run_cli, no_accelerator):
    result = run_cli("probe", "--json", env=no_accelerator)
    data = json.loads(result.stdout)
    assert (data["vendor"], data["backend"], data["distributed"]["backend"]) == ("none", "cpu", "gloo")
    assert data["cpu"]["cores"] >= 1


def test_select_without_an_accelerator_changes_nothing(run_cli, no_accelerator):
    select = run_cli("select", "--json", env=no_accelerator)
    assert select.returncode == 0 and json.loads(select.stdout)["env"] == {}


def test_metrics_name_the_devices_the_probe_names(run_cli):
    # The vendors' tools see the host's GPUs whatever a process is shown: on this host, what it has.
    metrics = json.loads(run_cli("metrics", "--json").stdout)
    probe = json.loads(run_cli("probe", "--json").stdout)
    assert sorted({d["vendor"] for d in metrics["devices"]}) == sorted({d["vendor"] for d in probe["devices"]})
    assert len(metrics["devices"]) == len(probe["devices"])
    assert metrics["devices"] or metrics["notes"]  # no device: a note says why


def test_help_and_spec_parsing_do_not_import_torch(cli_env):
    code = (
        "import sys, contextlib, io\n"
        "from ml_runtime import cli\n"
        "from ml_runtime.contract import checks, locate, spec\n"
        "from ml_runtime.devices import metrics\n"
        "from ml_runtime.policy import selection\n"
        "locate.load_spec(environ={'RUNTIME_WORKSPACE': '/nonexistent'})\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n        cli.main(['--help'])\n    except SystemExit:\n        pass\n"
        "print('torch' in sys.modules)\n"
    )
    result = python_prints(code, cli_env)
    assert result.stdout.strip() == "False", result.stderr


def test_mode_off_imports_no_probe_selection_or_checks(cli_env):
    # Every container start pays for what the entrypoint imports; mode off needs none of these.
    code = (
        "import sys, contextlib, io\n"
        "from ml_runtime import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    cli.main(['check', '--mode', 'off'])\n"
        "heavy = ('ml_runtime.devices.probe', 'ml_runtime.policy', 'ml_runtime.contract.checks', 'ml_runtime.report.items')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    result = python_prints(code, cli_env)
    assert result.stdout.strip() == "[]", result.stderr


def python_prints(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """*code* in a new interpreter (so sys.modules shows only what it imported)."""
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=False)


class Execed(Exception):
    """Raised by the os.execvpe stand-in."""


@pytest.fixture
def fake_exec(monkeypatch):
    calls = []

    def execvpe(file, args, env):
        calls.append((file, args, env))
        raise Execed

    monkeypatch.setattr(os, "execvpe", execvpe)
    return calls


def test_selection_reaches_only_the_child_environment(
    workspace, recorded_facts, fake_exec, monkeypatch, capsys
):
    (workspace / "accelerator-config.yaml").write_text(
        'criteria:\n  - min_compute_capability: "sm_80"\ncount: 2\n', encoding="utf-8"
    )
    (workspace / "runtime-spec.yaml").write_text(GPU_SPEC, encoding="utf-8")
    probe = build_probe(recorded_facts("nvidia"))  # T4 (sm_75), A100 (sm_80), H100 (sm_90)
    monkeypatch.setattr("ml_runtime.devices.probe.probe_host", lambda **_: probe)
    with pytest.raises(Execed):
        cli.main(["exec", "--", "python", "train.py"])
    ((file, args, env),) = fake_exec
    assert (file, args) == ("python", ["python", "train.py"])
    assert env["CUDA_VISIBLE_DEVICES"] == "2,1"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    err = capsys.readouterr().err
    assert (
        "[SELECT] backend cuda: devices 2 NVIDIA H100 80GB HBM3 (sm_90), 1 NVIDIA A100-SXM4-40GB (sm_80)"
        in err
    )
    # sm_80 holds on the selected devices although the T4 is visible
    assert (
        "[CHECK] gpu_compute_capability: [2] NVIDIA H100 80GB HBM3 (sm_90), [1] NVIDIA A100-SXM4-40GB (sm_80) -> OK"
        in err
    )


def test_backend_mismatch_is_exit_3_in_strict_mode(workspace, recorded_facts, fake_exec, monkeypatch, capsys):
    (workspace / "accelerator-config.yaml").write_text("backend: cuda\n", encoding="utf-8")
    probe = build_probe(recorded_facts("amd"))
    monkeypatch.setattr("ml_runtime.devices.probe.probe_host", lambda **_: probe)
    assert cli.main(["exec", "--", "python", "train.py"]) == 3
    assert fake_exec == []
    err = capsys.readouterr().err
    assert "backend cuda requested but this host has no NVIDIA accelerator (found: AMD (rocm))" in err
    # warn mode runs the command with the environment unchanged
    with pytest.raises(Execed):
        cli.main(["exec", "--mode", "warn", "--", "python", "train.py"])
    assert "CUDA_VISIBLE_DEVICES" not in fake_exec[0][2] and "HIP_VISIBLE_DEVICES" not in fake_exec[0][2]


def test_checker_bug_fails_strict_but_not_warn(workspace, fake_exec, monkeypatch, capsys):
    def broken(**_):
        raise ValueError("surprise")

    monkeypatch.setattr("ml_runtime.devices.probe.probe_host", broken)
    assert cli.main(["check"]) == 3
    assert "internal error while checking: ValueError: surprise" in capsys.readouterr().err
    assert cli.main(["check", "--mode", "warn"]) == 0


def test_the_checker_never_imports_torch_itself(cli_env):
    # The facts come from a child process: the process that execs holds no accelerator context.
    code = (
        "import sys\nfrom ml_runtime.cli import run_contract\nimport argparse, io\n"
        "ns = argparse.Namespace(spec=None, config=None, json=False, mode=None)\n"
        "code, env = run_contract(ns, io.StringIO())\n"
        "print(code, 'torch' in sys.modules)\n"
    )
    result = python_prints(code, cli_env)
    assert result.stdout.strip() == "0 False", result.stderr
