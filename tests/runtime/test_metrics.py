"""Metrics parsers and collection.

The files under fixtures/ are recordings of the real tools' output formats
(nvidia-smi, amd-smi, rocm-smi, xpu-smi), modelled on shared/FACTS.md and the
vendors' documentation, because we lack the hardware on this machine.
"""

from __future__ import annotations

import json
import sys
import types

import pytest
from ml_runtime.devices.metrics import collect_metrics
from ml_runtime.devices.smi import (
    parse_amd_smi_metric_json,
    parse_amd_smi_static,
    parse_nvidia_smi_csv,
    parse_rocm_smi_csv,
    parse_xpu_smi_discovery_csv,
    parse_xpu_smi_dump_csv,
)
from ml_runtime.devices.tools import ToolResult, normalize_header, parse_csv_table, parse_number


def test_nvidia_smi_with_units_in_headers_and_values(fixture_text):
    devices = parse_nvidia_smi_csv(fixture_text("nvidia-smi_query.csv"))
    assert [(d.index, d.model) for d in devices] == [
        (0, "Tesla T4"),
        (1, "NVIDIA A100-SXM4-40GB"),
        (2, "NVIDIA H100 80GB HBM3"),
    ]
    a100 = devices[1]
    assert (a100.utilization_pct, a100.temperature_c, a100.memory_used_mib, a100.memory_total_mib) == (
        87.0,
        61.0,
        31562.0,
        40960.0,
    )
    assert devices[2].utilization_pct is None  # [N/A]
    assert all(d.vendor == "nvidia" and d.source == "nvidia-smi" for d in devices)


def test_nvidia_smi_nounits_and_header_case(fixture_text):
    (h200,) = parse_nvidia_smi_csv(fixture_text("nvidia-smi_query_nounits.csv"))
    assert (h200.model, h200.utilization_pct, h200.memory_total_mib) == ("NVIDIA H200", 35.0, 143771.0)


def test_amd_smi_metric_json_new_format(fixture_text):
    devices = parse_amd_smi_metric_json(fixture_text("amd-smi_metric.json"))
    busy = devices[1]
    assert (busy.index, busy.utilization_pct, busy.temperature_c) == (1, 100.0, 78.0)  # hotspot: edge is N/A
    assert (busy.memory_used_mib, busy.memory_total_mib) == (181402.0, 196592.0)
    assert devices[0].utilization_pct == 0.0


def test_amd_smi_metric_json_legacy_list_with_bare_numbers(fixture_text):
    (device,) = parse_amd_smi_metric_json(fixture_text("amd-smi_metric_legacy.json"))
    assert (device.utilization_pct, device.temperature_c, device.memory_total_mib) == (12.0, 40.0, 65520.0)


def test_amd_smi_static_blocks(fixture_text):
    static = parse_amd_smi_static(fixture_text("amd-smi_static.txt"))
    assert sorted(static) == [0, 1]
    assert static[0]["MARKET_NAME"] == "AMD Instinct MI300X"
    assert static[0]["TARGET_GRAPHICS_VERSION"] == "gfx942"
    assert static[1]["SIZE"] == "196592 MB"


@pytest.mark.parametrize("name", ["rocm-smi_card_series_lower.csv", "rocm-smi_card_series_upper.csv"])
def test_rocm_smi_csv_header_case_variants(fixture_text, name):
    devices = parse_rocm_smi_csv(fixture_text(name))
    first = devices[0]
    assert first.model and first.model.upper().startswith("AMD INSTINCT")
    assert first.vendor == "amd" and first.source == "rocm-smi"
    assert first.memory_total_mib is not None and first.memory_total_mib > 60000
    assert first.temperature_c in (40.0, 45.0)  # junction preferred over edge


def test_rocm_smi_bytes_become_mib_and_system_row_is_skipped(fixture_text):
    lower = parse_rocm_smi_csv(fixture_text("rocm-smi_card_series_lower.csv"))
    assert [d.index for d in lower] == [0, 1]
    assert lower[1].utilization_pct == 100.0 and lower[1].memory_used_mib == 57344.0
    upper = parse_rocm_smi_csv(fixture_text("rocm-smi_card_series_upper.csv"))
    assert [d.index for d in upper] == [0]  # the "cardsystem" row is not a device
    assert upper[0].memory_total_mib == pytest.approx(206141652992 / 2**20)


def test_xpu_smi_discovery_and_dump(fixture_text):
    found = parse_xpu_smi_discovery_csv(fixture_text("xpu-smi_discovery.csv"))
    assert found[1] == {"name": "Intel(R) Data Center GPU Max 1550", "memory_total_mib": 65536.0}
    facts_format = parse_xpu_smi_discovery_csv(fixture_text("xpu-smi_discovery_facts.csv"))
    assert facts_format[0] == {"name": "Intel(R) Graphics [0x56c0]", "memory_total_mib": None}
    live = parse_xpu_smi_dump_csv(fixture_text("xpu-smi_dump.csv"))
    assert live[0] == {"utilization_pct": 97.5, "temperature_c": 58.0, "memory_used_mib": 61440.25}


def test_csv_helpers_strip_units_and_case():
    assert normalize_header("Memory.Total [MiB]") == ("memory.total", "MiB")
    assert normalize_header("  Card Series ") == ("card series", None)
    assert parse_csv_table("A, B\n\n1, 2\n") == [{"a": "1", "b": "2"}]
    assert [parse_number(v) for v in ("8188 MiB", "35 %", "[Not Supported]", "N/A", "", "41.5")] == [
        8188.0,
        35.0,
        None,
        None,
        None,
        41.5,
    ]


def fake_runner(outputs):
    """Runner answering from recorded outputs; anything else is 'not found'."""

    def run(argv):
        for prefix, text in outputs.items():
            if " ".join(argv).startswith(prefix):
                return ToolResult(True, text)
        return ToolResult(False, "", f"{argv[0]} not found on PATH")

    return run


@pytest.fixture
def no_pynvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError


def test_collect_on_a_cpu_host_gives_no_devices_and_notes(no_pynvml):
    report = collect_metrics(fake_runner({}))
    assert report.devices == [] and report.sources == []
    notes = " | ".join(report.notes)
    for tool in (
        "pynvml not installed",
        "nvidia-smi not found",
        "amd-smi not found",
        "rocm-smi not found",
        "xpu-smi not found",
        "no accelerator metrics available",
    ):
        assert tool in notes
    assert json.loads(json.dumps(report.to_dict()))["devices"] == []


def test_collect_amd_prefers_amd_smi_and_names_devices(no_pynvml, fixture_text):
    report = collect_metrics(
        fake_runner(
            {
                "amd-smi metric --json": fixture_text("amd-smi_metric.json"),
                "amd-smi static": fixture_text("amd-smi_static.txt"),
                "rocm-smi": fixture_text("rocm-smi_card_series_lower.csv"),
            }
        )
    )
    assert report.sources == ["amd-smi"]
    assert [d.model for d in report.devices] == ["AMD Instinct MI300X", "AMD Instinct MI300X"]


def test_collect_amd_falls_back_to_rocm_smi(no_pynvml, fixture_text):
    report = collect_metrics(fake_runner({"rocm-smi": fixture_text("rocm-smi_card_series_upper.csv")}))
    assert report.sources == ["rocm-smi"] and report.devices[0].model == "AMD Instinct MI300X"
    assert any(n.startswith("amd-smi:") for n in report.notes)


def test_collect_broken_json_is_a_note_not_a_traceback(no_pynvml):
    report = collect_metrics(fake_runner({"amd-smi metric": "Traceback (most recent call last):"}))
    assert report.devices == [] and any("unreadable JSON" in n for n in report.notes)


def test_collect_intel(no_pynvml, fixture_text):
    report = collect_metrics(
        fake_runner(
            {
                "xpu-smi discovery": fixture_text("xpu-smi_discovery.csv"),
                "xpu-smi dump -d 0,1 -m 0,3,18 -n 1": fixture_text("xpu-smi_dump.csv"),
            }
        )
    )
    assert report.sources == ["xpu-smi"]
    first = report.devices[0]
    assert (first.model, first.utilization_pct, first.memory_used_mib, first.memory_total_mib) == (
        "Intel(R) Data Center GPU Max 1550",
        97.5,
        61440.25,
        65536.0,
    )


def test_collect_nvidia_smi_when_nvml_is_missing(no_pynvml, fixture_text):
    report = collect_metrics(fake_runner({"nvidia-smi": fixture_text("nvidia-smi_query.csv")}))
    assert report.sources == ["nvidia-smi"] and len(report.devices) == 3


def test_collect_through_nvml(monkeypatch):
    # A stand-in for the pynvml module with the NVML calls the runtime uses.
    class NotSupported(Exception):
        pass

    def temperature(handle, sensor):
        if handle == 1:
            raise NotSupported("Not Supported")
        return 41

    nvml = types.SimpleNamespace(
        NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA H200" if h == 0 else "NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=35, memory=10),
        nvmlDeviceGetTemperature=temperature,
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(
            used=8188 * 2**20, total=143771 * 2**20, free=0
        ),
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    report = collect_metrics(fake_runner({}))
    assert report.sources == ["nvml"]
    assert [d.model for d in report.devices] == ["NVIDIA H200", "NVIDIA H100 80GB HBM3"]
    assert (
        report.devices[0].line()
        == "[METRICS] 0 nvidia NVIDIA H200: util 35% temp 41C mem 8188/143771 MiB (nvml)"
    )
    assert report.devices[1].temperature_c is None
