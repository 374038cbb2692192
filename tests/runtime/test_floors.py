"""The host driver's floor (``host_driver``): NVIDIA's table of CUDA releases against drivers, as data.

The figures are FACTS.md's ("Host driver floors, CDI and the start", from NVIDIA's release notes and
its minor-version compatibility guide); the probes are built in the test, each named by what it
stands for.
"""

from __future__ import annotations

import copy

import pytest
from ml_runtime.contract.floors import check_host_driver, floor_for, load_floors, runnable_series
from ml_runtime.contract.spec import Dependency
from ml_runtime.devices.probe import ProbeResult

TORCH = Dependency("pytorch", None, False, "dependencies[0]", host_driver=True)


def host(cuda: str | None, driver: str | None, vendor: str = "nvidia", hip: str | None = None) -> ProbeResult:
    flavour = f"cuda {cuda}" if cuda else f"rocm {hip}" if hip else "cpu"
    return ProbeResult(vendor, "cuda" if vendor != "none" else "cpu", driver_version=driver, driver_source="nvml",
                       torch={"version": "2.14.1", "cuda": cuda, "hip": hip, "flavour": flavour})


@pytest.mark.parametrize(("cuda", "driver", "ok"), [
    ("13.0", "580.159.04", True),   # the recorded H200
    ("13.0", "575.51.03", False),   # 12.9's driver
    ("13.1", "580.65.06", True),    # 13.x on any 580 (minor-version compatibility)
    ("12.8", "525.60.13", True),
    ("12.8", "520.61.05", False),
    ("11.8", "450.80.02", True),
    ("11.8", "450.57", False),
])
def test_the_series_floor(cuda, driver, ok):
    assert check_host_driver(TORCH, host(cuda, driver)).ok is ok


def test_below_the_release_its_own_driver_is_said():
    result = check_host_driver(TORCH, host("12.8", "535.54.03"))
    assert result.ok and "minor-version compatibility" in result.found and ">= 570.26" in result.found


def test_the_fix_names_the_image_the_host_can_run():
    result = check_host_driver(TORCH, host("13.0", "470.82.01"))
    assert result.suggestion == (
        "the NVIDIA driver 470.82.01 is older than CUDA 13.0 of this image needs (>= 580): upgrade the driver "
        "to >= 580, or run the image built for CUDA 11.x (e.g. nvidia-cu118), which runs on >= 450.80.02")
    assert runnable_series("418.67") is None
    assert str(check_host_driver(TORCH, host("13.0", "418.67")).suggestion).endswith("upgrade the driver to >= 580")


def test_a_new_cuda_series_is_a_line_of_data():
    table = copy.deepcopy(load_floors())
    assert check_host_driver(TORCH, host("14.0", "580.159.04"), table).ok  # not in the table: not judged
    table["cuda"]["series"]["14"] = {"driver": "600", "image": "nvidia-cu140"}
    assert floor_for("14.0", table).minimum == "600"
    assert not check_host_driver(TORCH, host("14.0", "580.159.04"), table).ok


@pytest.mark.parametrize(("probe", "found"), [
    (host(None, None, vendor="none"), "cpu build: no driver floor"),
    (host("13.0", None, vendor="none"), "no NVIDIA driver here (CUDA 13.0 build)"),
    (host(None, "6.8.5", vendor="amd", hip="6.2"), "6.8.5 (ROCm 6.2: not compared)"),
])
def test_nothing_to_compare_passes_and_says_so(probe, found):
    result = check_host_driver(TORCH, probe)
    assert result.ok and result.found == found
