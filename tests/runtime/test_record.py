"""The default spec's build-time record: a start that uses it unchanged imports no pydantic or YAML.

Any other spec (mounted, --spec, $RUNTIME_SPEC), and the default one once it or the validators
change, is validated in full.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from ml_runtime.contract import record
from ml_runtime.contract.fields import load_yaml_mapping
from ml_runtime.contract.locate import load_spec
from ml_runtime.contract.spec import DEFAULT_SPEC_PATH
from ml_runtime.contract.spec_file import parse_spec

START = (
    "import sys, contextlib, io\n"
    "from ml_runtime import cli\n"
    "with contextlib.redirect_stdout(io.StringIO()):\n"
    "    cli.main(['check'])\n"
    "print(sorted(m for m in ('pydantic', 'yaml', 'ml_runtime.contract.spec_file') if m in sys.modules))\n"
)


def start_imports(env: dict[str, str], record_dir: Path) -> list[str]:
    """What a start imports, its build-time records in *record_dir* ($RUNTIME_RECORD_DIR)."""
    proc = subprocess.run([sys.executable, "-c", START], env={**env, "RUNTIME_RECORD_DIR": str(record_dir)},
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1].replace("'", '"'))


def test_record_holds_what_validation_gives(tmp_path):
    out = tmp_path / "default-spec.json"
    recorded = record.record_spec(out)
    label = str(DEFAULT_SPEC_PATH)
    assert recorded == parse_spec(load_yaml_mapping(DEFAULT_SPEC_PATH, label), label)
    assert record.recorded_spec(label, out) == recorded


def test_record_round_trips_every_feature_kind(tmp_path):
    spec = parse_spec({"required_features": [{"gpu_compute_capability": "sm_90a"}, {"memory_bandwidth_gbps": "auto"},
                                             {"driver_version_min": {"nvidia": "535.54.03"}},
                                             {"device_memory_gb": 40}],
                       "dependencies": [{"name": "numpy", "version_range": "<2"}], "mode": "warn"}, "s.yaml")
    assert record._from_data(json.loads(json.dumps(record._to_data(spec))), "s.yaml") == spec


def test_a_stale_or_damaged_record_is_not_used(tmp_path):
    out = tmp_path / "default-spec.json"
    record.record_spec(out)
    document = json.loads(out.read_text(encoding="utf-8"))
    out.write_text(json.dumps({**document, "spec_key": "0" * 64}), encoding="utf-8")
    assert record.recorded_spec("x", out) is None
    out.write_text("{", encoding="utf-8")
    assert record.recorded_spec("x", out) is None


def test_start_with_the_recorded_default_imports_no_pydantic(cli_env, tmp_path):
    out = tmp_path / "records" / "default-spec.json"
    record.record_spec(out)
    assert start_imports(cli_env, out.parent) == []
    # Without a record (a host install), the default spec is validated.
    assert start_imports(cli_env, tmp_path / "none") == ["ml_runtime.contract.spec_file", "pydantic", "yaml"]


def test_a_mounted_spec_is_always_validated(cli_env, workspace, tmp_path):
    out = tmp_path / "records" / "default-spec.json"
    record.record_spec(out)
    shutil.copy(DEFAULT_SPEC_PATH, workspace / "runtime-spec.yaml")  # the same bytes, another file
    assert "pydantic" in start_imports(cli_env, out.parent)
    (workspace / "runtime-spec.yaml").write_text("mode: loud\n", encoding="utf-8")
    proc = subprocess.run([sys.executable, "-m", "ml_runtime", "check"], env=cli_env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"{workspace / 'runtime-spec.yaml'}: mode: 'loud' is not one of strict, warn, off"


def test_the_record_names_the_validators_it_is_keyed_to():
    here = Path(record.__file__).parent
    assert all((here / name).is_file() for name in record._VALIDATORS)
    assert load_spec(environ={"RUNTIME_WORKSPACE": "/nonexistent"}).source == str(DEFAULT_SPEC_PATH)
