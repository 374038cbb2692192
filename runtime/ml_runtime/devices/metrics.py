"""Unified per-device metrics from the vendors' own tools.

Sources, per vendor (a missing or failing source is skipped with a note):

* NVIDIA: NVML through ``pynvml``; else ``nvidia-smi --query-gpu=... --format=csv``.
* AMD: ``amd-smi metric --json`` plus ``amd-smi static`` (names); else
  ``rocm-smi --showuse --showtemp --showmeminfo vram --showproductname --csv``.
* Intel: ``xpu-smi discovery --dump 1,2,16`` (names, memory size) plus
  ``xpu-smi dump -d IDS -m 0,3,18 -n 1`` (utilisation, temperature, memory used).

The parsers of the tools' output are in :mod:`ml_runtime.devices.smi`.

Example:
    >>> from ml_runtime.devices.tools import ToolResult
    >>> collect_metrics(lambda argv: ToolResult(False, "", "not found"), nvml=None).devices
    []
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from ml_runtime.devices.nvml import load_pynvml
from ml_runtime.devices.smi import (
    DeviceMetrics,
    collect_nvml,
    parse_amd_smi_metric_json,
    parse_amd_smi_static,
    parse_nvidia_smi_csv,
    parse_rocm_smi_csv,
    parse_xpu_smi_discovery_csv,
    parse_xpu_smi_dump_csv,
)
from ml_runtime.devices.tools import Runner, run_tool

NVIDIA_SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,name,utilization.gpu,temperature.gpu,memory.used,memory.total",
    "--format=csv",
]

AMD_SMI_METRIC = ["amd-smi", "metric", "--json"]

AMD_SMI_STATIC = ["amd-smi", "static"]

ROCM_SMI_QUERY = [
    "rocm-smi",
    "--showuse",
    "--showtemp",
    "--showmeminfo",
    "vram",
    "--showproductname",
    "--csv",
]

XPU_SMI_DISCOVERY = ["xpu-smi", "discovery", "--dump", "1,2,16"]

XPU_SMI_METRICS = "0,3,18"  # GPU Utilization (%), GPU Core Temperature, GPU Memory Used (MiB)


@dataclass
class MetricsReport:
    """All devices from all sources plus notes about skipped sources.

    Example:
        >>> MetricsReport().to_dict()
        {'devices': [], 'sources': [], 'notes': []}
    """

    devices: list[DeviceMetrics] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``metrics --json``)."""
        return {"devices": [asdict(d) for d in self.devices], "sources": self.sources, "notes": self.notes}


def _from_tool(
    report: MetricsReport, runner: Runner, argv: list[str], parse: Callable[[str], list[DeviceMetrics]]
) -> None:
    """The devices a vendor tool lists (the tool's name is the source), or a note why not."""
    result = runner(argv)
    if not result.ok:
        report.notes.append(f"{argv[0]}: {result.note}")
        return
    report.devices.extend(parse(result.stdout))
    report.sources.append(argv[0])


def _collect_nvidia(report: MetricsReport, runner: Runner, pynvml: Any) -> None:
    if pynvml is None:
        report.notes.append("nvml: pynvml not installed (pip install nvidia-ml-py); trying nvidia-smi")
    else:
        try:
            report.devices.extend(collect_nvml(pynvml))
            report.sources.append("nvml")
            return
        except Exception as exc:  # NVMLError_LibraryNotFound on hosts without the driver
            report.notes.append(f"nvml: {type(exc).__name__}: {exc}")
    _from_tool(report, runner, NVIDIA_SMI_QUERY, parse_nvidia_smi_csv)


def _collect_amd(report: MetricsReport, runner: Runner, _pynvml: Any = None) -> None:
    result = runner(AMD_SMI_METRIC)
    if result.ok:
        try:
            devices = parse_amd_smi_metric_json(result.stdout)
        except ValueError as exc:
            report.notes.append(f"amd-smi: unreadable JSON ({exc}); trying rocm-smi")
        else:
            static = runner(AMD_SMI_STATIC)
            names = parse_amd_smi_static(static.stdout) if static.ok else {}
            if not static.ok:
                report.notes.append(f"amd-smi static: {static.note}")
            for device in devices:
                device.model = names.get(device.index, {}).get("MARKET_NAME")
            report.devices.extend(devices)
            report.sources.append("amd-smi")
            return
    else:
        report.notes.append(f"amd-smi: {result.note}")
    _from_tool(report, runner, ROCM_SMI_QUERY, parse_rocm_smi_csv)


def _collect_intel(report: MetricsReport, runner: Runner, _pynvml: Any = None) -> None:
    result = runner(XPU_SMI_DISCOVERY)
    if not result.ok:
        report.notes.append(f"xpu-smi: {result.note}")
        return
    found = parse_xpu_smi_discovery_csv(result.stdout)
    if not found:
        report.notes.append("xpu-smi: no devices discovered")
        return
    ids = ",".join(str(i) for i in sorted(found))
    dump = runner(["xpu-smi", "dump", "-d", ids, "-m", XPU_SMI_METRICS, "-n", "1"])
    live = parse_xpu_smi_dump_csv(dump.stdout) if dump.ok else {}
    if not dump.ok:
        report.notes.append(f"xpu-smi dump: {dump.note}")
    for index, info in sorted(found.items()):
        values = live.get(index, {})
        report.devices.append(
            DeviceMetrics(
                index=index,
                vendor="intel",
                model=info["name"],
                utilization_pct=values.get("utilization_pct"),
                temperature_c=values.get("temperature_c"),
                memory_used_mib=values.get("memory_used_mib"),
                memory_total_mib=info["memory_total_mib"],
                source="xpu-smi",
            )
        )
    report.sources.append("xpu-smi")


def collect_metrics(runner: Runner = run_tool, nvml: Any = "load") -> MetricsReport:
    """Query every vendor's sources; never raises. ``nvml`` is the pynvml module (``"load"``: import
    it when installed; None: no NVML).

    Example:
        >>> from ml_runtime.devices.tools import ToolResult
        >>> missing = lambda argv: ToolResult(False, "", f"{argv[0]} not found on PATH")
        >>> report = collect_metrics(missing, nvml=None)
        >>> report.devices, report.notes[-1]
        ([], 'no accelerator metrics available on this host (CPU only?)')
    """
    report = MetricsReport()
    pynvml = load_pynvml() if isinstance(nvml, str) else nvml
    for collect in (_collect_nvidia, _collect_amd, _collect_intel):
        try:
            collect(report, runner, pynvml)
        except Exception as exc:  # a parser surprise must not break the command
            report.notes.append(f"{collect.__name__[9:]}: {type(exc).__name__}: {exc}")
    if not report.devices:
        report.notes.append("no accelerator metrics available on this host (CPU only?)")
    return report
