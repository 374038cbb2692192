"""Container start: the torch/GPU probe is bounded (a wedged driver), and skipped when versions suffice.

A stand-in torch whose import hangs (as on a wedged GPU driver) comes first on PYTHONPATH, with
package metadata saying 2.13.0+cpu.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

VERSIONS_ONLY = 'dependencies:\n  - name: pytorch\n    version_range: ">=2.0"\n    full_distribution: false\n'


@pytest.fixture
def hanging_torch(tmp_path: Path, cli_env: dict[str, str]) -> dict[str, str]:
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("import time\ntime.sleep(60)\n")
    info = site / "torch-2.13.0+cpu.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n")
    return {"PYTHONPATH": f"{cli_env['PYTHONPATH']}:{site}"}


def test_a_hanging_probe_fails_within_the_timeout_naming_it(run_cli, hanging_torch):
    start = time.monotonic()
    result = run_cli("exec", "--", "true", env={**hanging_torch, "RUNTIME_PROBE_TIMEOUT": "1"})
    assert time.monotonic() - start < 10
    assert result.returncode == 3, result.stdout + result.stderr
    assert "[CHECK] pytorch:" in result.stderr and "-> FAIL" in result.stderr
    assert "timed out after 1 s" in result.stderr and "RUNTIME_PROBE_TIMEOUT" in result.stderr


def test_the_default_timeout_is_a_few_seconds():
    from ml_runtime.devices import isolated

    assert isolated.probe_timeout() <= 15


def test_a_versions_only_contract_never_imports_torch(run_cli, hanging_torch, workspace):
    (workspace / "runtime-spec.yaml").write_text(VERSIONS_ONLY)
    start = time.monotonic()
    result = run_cli("exec", "--", "true", env=hanging_torch)
    assert time.monotonic() - start < 5  # importing the hanging torch would take 60 s (or time out and fail)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[CHECK] pytorch: 2.13.0+cpu -> OK" in result.stderr
