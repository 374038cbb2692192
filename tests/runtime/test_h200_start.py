"""A container start on a recorded NVIDIA H200 host: the default contract from the image's record and NVML,
without torch; the host driver's floor.

We have no NVIDIA GPU. What the runtime reads at its boundary with the hardware is replayed from
recordings of a real H200 host (2026-12-04: driver 580.159.04, torch 2.11.0+cu130, no MIG;
fixtures/recorded/h200-2026-12-04-*):

- NVML's answers, through a stand-in ``pynvml`` (standins/pynvml.py) that reads them from
  h200-2026-12-04-nvml.json;
- the device nodes that host had (env.txt), as empty files in a folder laid out like its /dev
  (``RUNTIME_HOST_ROOT``);
- the image's build-time record of that torch: what gpu-check.json recorded of it, as the image
  build keeps it (``build_facts``), in ``RUNTIME_RECORD_DIR``.

The ``torch`` on PYTHONPATH is a stand-in carrying the recorded release's metadata (so the record
holds for it); importing it leaves a mark and fails: the H200's torch is not installed here, and
the default contract must not need it.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ml_runtime.contract import record as spec_record
from ml_runtime.devices.facts import TorchFacts, build_facts
from ml_runtime.devices.nvml import NvmlGpu, read_nvml, visible_gpus

HERE = Path(__file__).resolve().parent
RECORDED = HERE / "fixtures" / "recorded"
STANDINS = HERE / "standins"
NOTES = HERE.parent / "fixtures" / "notes"
CHECK = json.loads((RECORDED / "h200-2026-12-04-gpu-check.json").read_text())
NVML = json.loads((RECORDED / "h200-2026-12-04-nvml.json").read_text())
COMMAND = [sys.executable, "-c", "print('COMMAND RAN')"]

STANDIN_TORCH = """\
import os
with open(os.environ["STANDIN_TORCH_MARK"], "a") as mark:
    mark.write("torch imported\\n")
raise ImportError("stand-in: the recorded H200's torch 2.11.0+cu130 is not installed here")
"""


class H200:
    """The recorded host: its environment for a child process, and the mark an import of torch leaves."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env, self.mark = root, env, root / "torch-imported"

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *args], env={**self.env, **(env or {})}, cwd=self.root,
                              capture_output=True, text=True, timeout=120, check=False)

    def runtime(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return self.run("-m", "ml_runtime", *args, env=env)

    def torch_imported(self) -> bool:
        return self.mark.exists()

    def with_nvml(self, **answers: Any) -> dict[str, str]:
        """The recording with some of NVML's answers changed (the test says which, and why)."""
        path = self.root / "nvml-changed.json"
        path.write_text(json.dumps({**NVML, **answers}))
        return {"PYNVML_RECORDING": str(path)}


def _standin_torch(site: Path, version: str) -> None:
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(STANDIN_TORCH)
    info = site / f"torch-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    (info / "RECORD").write_text("torch/__init__.py,,\n")


@pytest.fixture
def h200(tmp_path: Path, cli_env: dict[str, str]) -> H200:
    site, host, records = tmp_path / "site", tmp_path / "host", tmp_path / "records"
    recorded_torch = CHECK["raw"]["torch_facts"]
    _standin_torch(site, recorded_torch["torch_version"])
    (host / "dev").mkdir(parents=True)
    for node in ("nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"):  # env.txt: ls /dev/nvidia*
        (host / "dev" / node).touch()
    env = {**cli_env, "PYTHONPATH": f"{STANDINS}:{site}:{cli_env['PYTHONPATH']}", "RUNTIME_HOST_ROOT": str(host),
           "RUNTIME_RECORD_DIR": str(records), "STANDIN_TORCH_MARK": str(tmp_path / "torch-imported")}
    code = "from ml_runtime.devices.facts import torch_install_key as k; print(k())"
    key = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True)
    records.mkdir()
    document = {"torch_install": key.stdout.strip(), "facts": build_facts(TorchFacts.from_dict(recorded_torch)).to_dict()}
    (records / "torch-facts.json").write_text(json.dumps(document))
    spec_record.record_spec(records / "default-spec.json")  # as the image build does
    return H200(tmp_path, env)


def lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return proc.stderr.strip().splitlines()


def test_default_contract_answers_from_the_record_and_nvml(h200):
    proc = h200.run("-m", "ml_runtime", "exec", "--", *COMMAND)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "COMMAND RAN\n"
    assert lines(proc)[2:] == [
        "[CHECK] pytorch: 2.11.0+cu130 -> OK",
        "[CHECK] pytorch.full_distribution: torch.distributed (gloo, nccl) -> OK",  # nccl: the GPU is seen
        "[CHECK] pytorch.host_driver: 580.159.04 (nvml) -> OK",
    ]
    assert not h200.torch_imported()


def test_the_start_imports_no_torch_and_asks_nvml(h200):
    code = ("import sys, contextlib, io\nfrom ml_runtime import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    code = cli.main(['check'])\n"
            "print(code, sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pynvml')))\n")
    proc = h200.run("-c", code)
    assert proc.stdout.strip() == "0 ['pynvml']", proc.stderr
    assert not h200.torch_imported()  # nor in a child process


def test_the_probe_gives_what_torch_gave_on_the_h200(h200):
    proc = h200.runtime("probe", "--json")
    assert proc.returncode == 0, proc.stderr
    probe, recorded = json.loads(proc.stdout), CHECK["raw"]["probe"]
    for key in ("vendor", "backend", "torch", "driver", "distributed"):
        assert probe[key] == recorded[key], key
    (device,), (then,) = probe["devices"], recorded["devices"]
    for key in ("index", "name", "vendor", "compute_capability", "uuid"):
        assert device[key] == then[key], key
    # NVML's total is nvidia-smi's (env.txt: 143771MiB); CUDA counts 616 MiB less as usable.
    assert (device["memory_total_mib"], then["memory_total_mib"]) == (143771, 143155)
    assert probe["source"] == {"facts": "record+nvml", "torch_imported": None}
    assert not h200.torch_imported()


def test_the_notes_accelerator_config_chooses_as_on_the_h200(h200):
    proc = h200.runtime("select", "--config", str(NOTES / "accelerator-config.yaml"), "--json")
    assert proc.returncode == 0, proc.stderr
    chosen, recorded = json.loads(proc.stdout), CHECK["raw"]["select"]
    for key in ("backend", "vendor", "variable", "priority", "env", "problems"):
        assert chosen[key] == recorded[key], key
    assert [d["name"] for d in chosen["devices"]] == [d["name"] for d in recorded["devices"]]
    assert not h200.torch_imported()


def test_the_metrics_are_nvmls_as_recorded(h200):
    proc = h200.runtime("metrics", "--json")
    assert json.loads(proc.stdout)["devices"] == CHECK["raw"]["metrics"]["devices"]


def test_hidden_gpus_leave_the_cpu_and_the_driver_still_checked(h200):
    proc = h200.runtime("exec", "--", *COMMAND, env={"CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr
    assert "[CHECK] pytorch.full_distribution: torch.distributed (gloo, nccl) -> OK" in lines(proc)
    probe = json.loads(h200.runtime("probe", "--json", env={"CUDA_VISIBLE_DEVICES": ""}).stdout)
    assert (probe["vendor"], probe["devices"], probe["distributed"]["backend"]) == ("none", [], "gloo")
    assert probe["driver"] == {"version": "580.159.04", "source": "nvml"}
    assert not h200.torch_imported()


def test_a_spec_measuring_bandwidth_imports_torch_and_says_why(h200):
    proc = h200.runtime("exec", "--spec", str(NOTES / "runtime-spec-gpu.yaml"), "--", *COMMAND)
    assert ("[INFO] Probe: the spec's memory_bandwidth_gbps is measured on the devices: torch imported in a "
            "child process, a few seconds") in lines(proc)
    assert h200.torch_imported()


# The H200's recording with one answer changed: the driver a host that was never upgraded past CUDA 12.2
# answers (535.54.03, CUDA driver 12.2), below the 580 that the image's CUDA 13.0 needs.
OLD_DRIVER = {"driver_version": "535.54.03", "cuda_driver_version": 12020}


def test_a_driver_below_the_floor_stops_the_command_with_one_line(h200):
    proc = h200.runtime("exec", "--", *COMMAND, env=h200.with_nvml(**OLD_DRIVER))
    assert proc.returncode == 3 and "COMMAND RAN" not in proc.stdout
    assert "[CHECK] pytorch.host_driver: 535.54.03 (nvml) -> FAIL (CUDA 13.0 needs an NVIDIA driver >= 580)" in lines(proc)
    assert lines(proc)[-1] == (
        "runtime-check: 1 of 3 checks failed: the NVIDIA driver 535.54.03 is older than CUDA 13.0 of this image "
        "needs (>= 580): upgrade the driver to >= 580, or run the image built for CUDA 12.x (e.g. nvidia-cu126), "
        "which runs on >= 525, or set RUNTIME_CHECK_MODE=warn")
    assert not h200.torch_imported()


def test_warn_mode_runs_the_command_on_a_driver_below_the_floor(h200):
    proc = h200.runtime("exec", "--", *COMMAND, env={**h200.with_nvml(**OLD_DRIVER), "RUNTIME_CHECK_MODE": "warn"})
    assert proc.returncode == 0 and proc.stdout == "COMMAND RAN\n", proc.stderr
    assert "[CHECK] pytorch.host_driver: 535.54.03 (nvml) -> WARN (CUDA 13.0 needs an NVIDIA driver >= 580)" in lines(proc)


# NVML's GPUs as CUDA numbers them: pure functions, the recorded H200 and stand-ins built here.
def recorded_gpu(**changes: Any) -> NvmlGpu:
    gpu = NVML["gpus"][0]
    values = {"index": 0, "name": gpu["name"], "major": 9, "minor": 0, "memory_total": gpu["memory_total"],
              "uuid": gpu["uuid"], "bus_id": gpu["pci_bus_id"]}
    return NvmlGpu(**{**values, **changes})


def test_the_recorded_nvml_reads_as_the_h200(monkeypatch):
    monkeypatch.delenv("PYNVML_RECORDING", raising=False)
    spec = importlib.util.spec_from_file_location("standin_pynvml", STANDINS / "pynvml.py")
    assert spec is not None and spec.loader is not None
    pynvml = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pynvml)
    host = read_nvml(pynvml)
    assert (host.driver_version, host.cuda_driver, host.gpus) == ("580.159.04", "13.0", [recorded_gpu()])


def test_cuda_visible_devices_as_cuda_reads_it():
    a = recorded_gpu()
    b = recorded_gpu(index=1, uuid="GPU-1b2c3d4e", bus_id="00000000:00:07.0")

    def names(value: str | None, gpus=(b, a)) -> list[str | None] | None:
        env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
        devices, _ = visible_gpus(list(gpus), env)
        return None if devices is None else [d.uuid for d in devices]

    assert names(None) == ["85f76a7a-3eb2-1600-42ae-7016098d07c7", "1b2c3d4e"]  # PCI bus order
    assert names("1,0") == ["1b2c3d4e", "85f76a7a-3eb2-1600-42ae-7016098d07c7"]
    assert names("GPU-1b2") == ["1b2c3d4e"]  # a unique UUID prefix
    assert names("0,-1,1") == ["85f76a7a-3eb2-1600-42ae-7016098d07c7"]  # an invalid entry ends the list
    assert names("") == [] and names("7") == []
    assert names("0,0") is None  # not guessed: torch is asked
    assert names("MIG-abc") is None


def test_where_nvml_and_cuda_may_differ_torch_is_asked():
    a, h100 = recorded_gpu(), recorded_gpu(index=1, name="NVIDIA H100", uuid="GPU-2", bus_id="00000000:00:07.0")
    assert visible_gpus([a, h100], {})[0] is None  # CUDA orders different models fastest first
    assert visible_gpus([a, h100], {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})[0] is not None
    devices, why = visible_gpus([recorded_gpu(mig=True)], {})
    assert devices is None and why is not None and "MIG" in why
