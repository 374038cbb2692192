"""Per-vendor compute capability parsing and ordering (never across vendors)."""

from __future__ import annotations

import pytest
from ml_runtime.devices.capability import (
    amd_capability,
    intel_capability,
    intel_device_id_from_name,
    nvidia_capability,
    parse_capability,
    satisfies,
    suggestion,
)


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("sm_70", (7, 0)),
        ("sm_80", (8, 0)),
        ("sm_86", (8, 6)),
        ("sm_90", (9, 0)),
        ("sm_100", (10, 0)),
        ("sm_120", (12, 0)),
        ("sm_121", (12, 1)),
    ],
)
def test_nvidia_sm_parsing(text, version):
    cap = parse_capability(text)
    assert cap.vendor == "nvidia" and cap.version == version


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("gfx908", (9, 0, 8)),
        ("gfx90a", (9, 0, 10)),
        ("gfx940", (9, 4, 0)),
        ("gfx942", (9, 4, 2)),
        ("gfx950", (9, 5, 0)),
        ("gfx1030", (10, 3, 0)),
        ("gfx1100", (11, 0, 0)),
        ("gfx1151", (11, 5, 1)),
        ("gfx1201", (12, 0, 1)),
    ],
)
def test_amd_gfx_parsing_major_minor_stepping(text, version):
    cap = parse_capability(text)
    assert cap.vendor == "amd" and cap.version == version


@pytest.mark.parametrize(
    "bad", ["sm8", "sm_8", "80", "8.0", "gfx9", "gfx90", "gfx90a:xnack-", "cuda", "", "0x"]
)
def test_bad_strings_are_rejected_with_the_expected_forms(bad):
    with pytest.raises(ValueError, match=r"expected sm_XY, gfxNNN\[a-z\] or"):
        parse_capability(bad)


def test_nvidia_minimum_ordering():
    need = parse_capability("sm_80")
    assert satisfies(nvidia_capability(8, 0), need) == (True, "")
    assert satisfies(nvidia_capability(8, 6), need)[0]
    assert satisfies(nvidia_capability(12, 0), need)[0]
    ok, why = satisfies(nvidia_capability(7, 5), need)
    assert not ok and why == "requires compute capability >= 8.0 (sm_80) but found sm_75 (7.5)"


def test_nvidia_arch_specific_and_family_suffixes():
    assert satisfies(nvidia_capability(9, 0), parse_capability("sm_90a"))[0]
    assert not satisfies(nvidia_capability(10, 0), parse_capability("sm_90a"))[
        0
    ]  # 'a' is not forward compatible
    assert satisfies(nvidia_capability(10, 3), parse_capability("sm_100f"))[0]
    assert not satisfies(nvidia_capability(12, 0), parse_capability("sm_100f"))[0]


def test_gfx_ordering_within_a_family():
    assert satisfies(parse_capability("gfx90a"), parse_capability("gfx908"))[0]  # gfx90a > gfx908
    assert satisfies(parse_capability("gfx942"), parse_capability("gfx90a"))[0]  # gfx942 > gfx90a
    assert satisfies(parse_capability("gfx950"), parse_capability("gfx942"))[0]
    assert not satisfies(parse_capability("gfx908"), parse_capability("gfx90a"))[0]
    assert satisfies(parse_capability("gfx1101"), parse_capability("gfx1100"))[0]


def test_gfx_families_are_not_ordered_across_majors():
    ok, why = satisfies(parse_capability("gfx1100"), parse_capability("gfx90a"))
    assert not ok and "different AMD families are not ordered" in why
    assert not satisfies(parse_capability("gfx90a"), parse_capability("gfx1030"))[0]


def test_amd_arch_name_feature_flags_are_ignored():
    cap = amd_capability("gfx942:sramecc+:xnack-")
    assert cap is not None and cap.text == "gfx942" and cap.version == (9, 4, 2)
    assert amd_capability(None) is None and amd_capability("unknown") is None


def test_never_compared_across_vendors():
    found = amd_capability("gfx90a:sramecc+:xnack-")
    assert found is not None
    ok, why = satisfies(found, parse_capability("sm_80"))
    assert not ok and why == "requires an NVIDIA GPU (sm_80) but found AMD gfx90a"
    ok, why = satisfies(nvidia_capability(9, 0), parse_capability("gfx90a"))
    assert not ok and why == "requires an AMD GPU (gfx90a) but found NVIDIA sm_90"
    ok, why = satisfies(intel_capability(0x0BD5), parse_capability("sm_80"))
    assert not ok and why.startswith("requires an NVIDIA GPU (sm_80) but found Intel 0x0bd5")


def test_intel_family_and_device_id_matching():
    max1550 = intel_capability(0x0BD5, "Intel(R) Data Center GPU Max 1550")
    assert max1550.family == "pvc"
    assert satisfies(max1550, parse_capability("pvc"))[0]
    assert satisfies(max1550, parse_capability("0x0bd5"))[0]
    assert not satisfies(max1550, parse_capability("dg2"))[0]
    assert not satisfies(max1550, parse_capability("0x0bda"))[0]
    flex = intel_capability(None, "Intel(R) Graphics [0x56c0]")  # xpu-smi style name
    assert flex.device_id == 0x56C0 and flex.family == "dg2"
    assert intel_device_id_from_name("Intel(R) Arc(TM) B580 Graphics") is None
    unknown = intel_capability(0x1234, "Intel(R) Mystery")
    ok, why = satisfies(unknown, parse_capability("bmg"))
    assert not ok and "unknown to this checker" in why


def test_suggestions_name_the_vendor_and_minimum():
    assert (
        suggestion(parse_capability("sm_80"))
        == "run on a host with an NVIDIA GPU of compute capability >= 8.0"
    )
    assert "gfx90a or newer of the gfx9 family" in suggestion(parse_capability("gfx90a"))
    assert "Data Center GPU Max" in suggestion(parse_capability("pvc"))
