"""The vendors' tools' metric output, parsed into :class:`DeviceMetrics`.

The parsers are pure functions of each tool's text output. CSV headers are
matched case-insensitively with units stripped (``memory.total [MiB]``),
values lose their units (``8188 MiB``). Memory is reported in MiB; amd-smi's
"MB" is treated as MiB (uncertain: amd-smi divides bytes by 1024*1024).
Device indices are the tools' own (physical) numbering, which ignores
CUDA_VISIBLE_DEVICES and friends.

Example:
    >>> rows = parse_nvidia_smi_csv(
    ...     "index, name, utilization.gpu [%], temperature.gpu, memory.used [MiB], memory.total [MiB]\\n"
    ...     "0, NVIDIA H200, 35 %, 41, 8188 MiB, 143771 MiB\\n")
    >>> rows[0].utilization_pct, rows[0].memory_total_mib
    (35.0, 143771.0)
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ml_runtime.devices.tools import parse_csv_table, parse_number, pick

_MEMORY_UNITS_TO_MIB = {
    "b": 1 / 2**20,
    "kb": 1 / 1024,
    "kib": 1 / 1024,
    "mb": 1.0,
    "mib": 1.0,
    "gb": 1024.0,
    "gib": 1024.0,
}


@dataclass
class DeviceMetrics:
    """One device's metrics; unknown values are None.

    Example:
        >>> DeviceMetrics(0, "amd", "AMD Instinct MI300X", memory_total_mib=196592.0).memory_used_mib is None
        True
    """

    index: int
    vendor: str
    model: str | None = None
    utilization_pct: float | None = None
    temperature_c: float | None = None
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    source: str = ""

    def line(self) -> str:
        """One text line of the ``metrics`` report.

        Example:
            >>> DeviceMetrics(0, "nvidia", "NVIDIA H200", 35.0, 41.0, 8188.0, 143771.0, "nvml").line()
            '[METRICS] 0 nvidia NVIDIA H200: util 35% temp 41C mem 8188/143771 MiB (nvml)'
        """

        def num(v: float | None, unit: str = "") -> str:
            return "?" if v is None else f"{v:.0f}{unit}"

        return (
            f"[METRICS] {self.index} {self.vendor} {self.model or 'unknown model'}: "
            f"util {num(self.utilization_pct, '%')} temp {num(self.temperature_c, 'C')} "
            f"mem {num(self.memory_used_mib)}/{num(self.memory_total_mib)} MiB ({self.source})"
        )


def parse_nvidia_smi_csv(text: str) -> list[DeviceMetrics]:
    """Parse ``nvidia-smi --query-gpu=... --format=csv[,nounits]`` output.

    Example:
        >>> text = "index,name,utilization.gpu,temperature.gpu,memory.used,memory.total\\n1,T4,[N/A],4,0,1"
        >>> parse_nvidia_smi_csv(text)[0].utilization_pct is None
        True
    """
    devices = []
    for position, row in enumerate(parse_csv_table(text)):
        index = parse_number(row.get("index"))
        devices.append(
            DeviceMetrics(
                index=int(index) if index is not None else position,
                vendor="nvidia",
                model=pick(row, "name"),
                utilization_pct=parse_number(row.get("utilization.gpu")),
                temperature_c=parse_number(row.get("temperature.gpu")),
                memory_used_mib=parse_number(row.get("memory.used")),
                memory_total_mib=parse_number(row.get("memory.total")),
                source="nvidia-smi",
            )
        )
    return devices


def collect_nvml(pynvml: Any) -> list[DeviceMetrics]:
    """Metrics through an imported ``pynvml`` module (NVML).

    Example:
        >>> collect_nvml(None)  # doctest: +SKIP
    """

    def call(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:  # NVMLError_NotSupported and friends: leave the value unknown
            return None

    pynvml.nvmlInit()
    try:
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = call(pynvml.nvmlDeviceGetName, handle)
            util = call(pynvml.nvmlDeviceGetUtilizationRates, handle)
            temp = call(pynvml.nvmlDeviceGetTemperature, handle, getattr(pynvml, "NVML_TEMPERATURE_GPU", 0))
            mem = call(pynvml.nvmlDeviceGetMemoryInfo, handle)
            devices.append(
                DeviceMetrics(
                    index=index,
                    vendor="nvidia",
                    model=name.decode() if isinstance(name, bytes) else name,
                    utilization_pct=float(util.gpu) if util is not None else None,
                    temperature_c=float(temp) if temp is not None else None,
                    memory_used_mib=mem.used / 2**20 if mem is not None else None,
                    memory_total_mib=mem.total / 2**20 if mem is not None else None,
                    source="nvml",
                )
            )
        return devices
    finally:
        pynvml.nvmlShutdown()


def _amd_value(node: Any) -> tuple[float | None, str | None]:
    # amd-smi prints {"value": 35, "unit": "C"}, a bare number, or "N/A" by version.
    if isinstance(node, dict):
        return parse_number(node.get("value")), node.get("unit")
    return parse_number(node), None


def _amd_mib(node: Any) -> float | None:
    value, unit = _amd_value(node)
    if value is None:
        return None
    return value * _MEMORY_UNITS_TO_MIB.get((unit or "MB").strip().lower(), 1.0)


def _first(section: Any, *keys: str) -> Any:
    if not isinstance(section, dict):
        return None
    for key in keys:
        if key in section and _amd_value(section[key])[0] is not None:
            return section[key]
    return None


def parse_amd_smi_metric_json(text: str) -> list[DeviceMetrics]:
    """Parse ``amd-smi metric --json`` (a list, or ``{"gpu_data": [...]}`` in newer versions).

    Temperature prefers ``hotspot`` (junction), which Instinct GPUs always
    report, then ``edge``.

    Example:
        >>> text = '[{"gpu": 0, "usage": {"gfx_activity": {"value": 7, "unit": "%"}}}]'
        >>> parse_amd_smi_metric_json(text)[0].utilization_pct
        7.0
    """
    data = json.loads(text)
    if isinstance(data, dict):
        data = data.get("gpu_data", data.get("gpus", []))
    devices = []
    for position, entry in enumerate(data if isinstance(data, list) else []):
        if not isinstance(entry, dict):
            continue
        usage = entry.get("usage", {})
        temperature = entry.get("temperature", {})
        memory = entry.get("mem_usage", {})
        index = parse_number(entry.get("gpu"))
        devices.append(
            DeviceMetrics(
                index=int(index) if index is not None else position,
                vendor="amd",
                utilization_pct=_amd_value(_first(usage, "gfx_activity", "gfx_usage", "gfx_busy_inst"))[0],
                temperature_c=_amd_value(_first(temperature, "hotspot", "junction", "edge"))[0],
                memory_used_mib=_amd_mib(_first(memory, "used_vram", "used_visible_vram")),
                memory_total_mib=_amd_mib(_first(memory, "total_vram", "total_visible_vram")),
                source="amd-smi",
            )
        )
    return devices


def parse_amd_smi_static(text: str) -> dict[int, dict[str, str]]:
    """Parse ``amd-smi static`` text into ``{gpu: {KEY: value}}`` (leaf keys upper-case).

    Example:
        >>> text = "GPU: 0\\n    ASIC:\\n        MARKET_NAME: AMD Instinct MI300X\\n"
        >>> parse_amd_smi_static(text)[0]["MARKET_NAME"]
        'AMD Instinct MI300X'
    """
    result: dict[int, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        key, sep, value = line.strip().partition(":")
        if not sep:
            continue
        key, value = key.strip().upper(), value.strip()
        if not line.startswith((" ", "\t")):  # a top-level block: "GPU: N" (or CPU/NIC data)
            number = parse_number(value) if key == "GPU" else None
            current = result.setdefault(int(number), {}) if number is not None else None
        elif current is not None and value:
            current.setdefault(key, value)  # first occurrence wins (e.g. VERSION under DRIVER vs IFWI)
    return result


def parse_rocm_smi_csv(text: str) -> list[DeviceMetrics]:
    """Parse ``rocm-smi --showuse --showtemp --showmeminfo vram --showproductname --csv``.

    Only ``cardN`` rows are devices (old versions also print a ``system`` row).

    Example:
        >>> t = ("device,GPU use (%),VRAM Total Memory (B),VRAM Total Used Memory (B),Card series\\n"
        ...      "card0,3,68702699520,10960896,AMD Instinct MI210\\n")
        >>> parse_rocm_smi_csv(t)[0].memory_total_mib
        65520.0
    """
    devices = []
    for row in parse_csv_table(text):
        match = re.fullmatch(r"card(\d+)", (row.get("device") or "").strip().lower())
        if not match:
            continue
        total = parse_number(row.get("vram total memory (b)"))
        used = parse_number(row.get("vram total used memory (b)"))
        devices.append(
            DeviceMetrics(
                index=int(match.group(1)),
                vendor="amd",
                model=pick(row, "card series", "card sku", "card model"),
                utilization_pct=parse_number(row.get("gpu use (%)")),
                temperature_c=parse_number(
                    pick(row, "temperature (sensor junction) (c)", "temperature (sensor edge) (c)")
                ),
                memory_used_mib=used / 2**20 if used is not None else None,
                memory_total_mib=total / 2**20 if total is not None else None,
                source="rocm-smi",
            )
        )
    return devices


def _rows_by_device(text: str, *id_columns: str) -> Iterator[tuple[int, dict[str, str]]]:
    """(device id, row) for the CSV rows whose first present id column is a number."""
    for row in parse_csv_table(text):
        device = parse_number(next((row[c] for c in id_columns if c in row), None))
        if device is not None:
            yield int(device), row


def parse_xpu_smi_discovery_csv(text: str) -> dict[int, dict[str, Any]]:
    """Parse ``xpu-smi discovery --dump 1,2,16`` into ``{id: {name, memory_total_mib}}``.

    Example:
        >>> text = 'Device ID,Device Name,Memory Physical Size\\n0,"Intel(R) Max 1550","65536.00 MiB"'
        >>> parse_xpu_smi_discovery_csv(text)[0]["memory_total_mib"]
        65536.0
    """
    return {
        device: {
            "name": pick(row, "device name"),
            "memory_total_mib": parse_number(row.get("memory physical size")),
        }
        for device, row in _rows_by_device(text, "device id")
    }


def parse_xpu_smi_dump_csv(text: str) -> dict[int, dict[str, float | None]]:
    """Parse ``xpu-smi dump -m 0,3,18 -n 1``; the last row per device wins.

    Example:
        >>> t = ("Timestamp, DeviceId, GPU Utilization (%), GPU Core Temperature (Celsius Degree), "
        ...      "GPU Memory Used (MiB)\\n06:14:46.000,    0, 12.50, 41.00, 24.57\\n")
        >>> parse_xpu_smi_dump_csv(t)[0]["utilization_pct"]
        12.5
    """
    result: dict[int, dict[str, float | None]] = {}
    for device, row in _rows_by_device(text, "deviceid", "device id"):
        result[device] = {
            "utilization_pct": parse_number(row.get("gpu utilization (%)")),
            "temperature_c": parse_number(
                pick(row, "gpu core temperature (celsius degree)", "gpu core temperature (c)")
            ),
            "memory_used_mib": parse_number(row.get("gpu memory used (mib)")),
        }
    return result
