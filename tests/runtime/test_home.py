"""A writable HOME for any UID (docker run -u, runAsUser, builder run as the host user)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from ml_runtime.devices.selftest import EXPECTED_SUM, compute_check, process_facts
from ml_runtime.home import private_home


def test_writable_home_is_kept(tmp_path):
    assert private_home(home=str(tmp_path), tmp=str(tmp_path)) is None


def test_missing_or_unwritable_home_gets_a_private_one(tmp_path):
    got = private_home(home="/nonexistent-home", tmp=str(tmp_path))
    assert got == str(tmp_path / f"home-{os.getuid()}")
    info = os.stat(got)
    assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
    assert private_home(home="", tmp=str(tmp_path)) == got  # the same folder on the next start


def test_a_folder_planted_by_another_uid_is_not_used(tmp_path):
    planted = tmp_path / "home-4242"
    planted.mkdir()  # owned by this UID, not 4242
    got = private_home(home="/nonexistent-home", tmp=str(tmp_path), uid=4242)
    assert got is not None and got != str(planted) and os.path.basename(got).startswith("home-4242-")


def test_exec_gives_the_command_a_writable_home(cli_env, workspace):
    env = {**cli_env, "HOME": "/nonexistent-home", "TMPDIR": str(workspace), "RUNTIME_CHECK_MODE": "off"}
    code = "import pathlib; p = pathlib.Path.home() / 'x'; p.write_text('ok'); print(p)"
    proc = subprocess.run([sys.executable, "-m", "ml_runtime", "exec", "--", sys.executable, "-c", code],
                          env=env, cwd=workspace, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(workspace / f"home-{os.getuid()}" / "x")


def test_self_test_reports_the_process_and_a_real_tensor_op():
    facts = process_facts()
    assert facts["uid"] == os.getuid() and facts["cwd"] == os.getcwd()
    assert compute_check("cpu") == {"ok": True, "value": EXPECTED_SUM}
    assert compute_check("no-such-device")["ok"] is False
