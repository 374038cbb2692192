"""The bench's report: the cold row's goals and table against both baselines (gzip and zstd), and the
cold row with the wheel contexts pruned first."""

from __future__ import annotations

from typing import Any

from bench.report import baseline_table, goals, markdown, pruned_table


def _side(cold: float) -> dict[str, Any]:
    t = "cpu"
    return {"cold_build_s": {t: cold}, "cold_samples_s": {t: [cold] * 3}, "cold_phases_s": {t: {"steps": cold / 2}},
            "noop_rebuild_s_per_target": {t: 0.5}, "noop_all_cached": {t: True}, "runtime_change_rebuild_s": {t: 9.0},
            "image_bytes": {t: 2e9}, "essential_bytes": {t: 2e9}, "size_ratio_vs_essential": {t: 1.0},
            "shared_bytes": None, "shared_bytes_fraction": 0.0, "shared_fraction_below_torch": None}


def test_the_cold_build_is_judged_against_the_zstd_baseline_too() -> None:
    results = {**_side(30.0), "baseline": _side(68.0),
               "baseline_zstd": {"cold_build_s": {"cpu": 45.0}, "cold_samples_s": {"cpu": [44.0, 45.0, 51.0]},
                                 "cold_phases_s": {"cpu": {"export": 7.5}}}}
    found = {g["goal"]: g for g in goals(results, ["cpu"])}
    zstd = found["cold build cpu <= 0.5 x the strong baseline exported with zstd"]
    assert (zstd["met"], zstd["detail"]) == (False, "30.0 s vs 45.0 s (0.67 x)")
    assert found["cold build cpu <= 0.45 x the strong baseline"]["met"] is True
    table = "\n".join(baseline_table(results, ["cpu"]))
    assert "| cold build of the baseline exported with zstd (s, median of 3; samples [44.0, 45.0, 51.0]) | cpu | 30.0 | 45.0 |" in table
    assert "| of the zstd baseline's cold build: BuildKit's export (s, median) | cpu | 0 | 7.5 |" in table


def test_a_run_without_the_zstd_baseline_has_no_such_goal() -> None:
    results = {**_side(30.0), "baseline": _side(68.0)}
    assert not [g for g in goals(results, ["cpu"]) if "zstd" in g["goal"]]
    assert "zstd" not in "\n".join(baseline_table(results, ["cpu"]))


def _pruned(side: str, seconds: list[float], pruned: list[int]) -> dict[str, Any]:
    t = "nvidia-cu130"
    return {"cold_build_s": {t: sorted(seconds)[1]}, "cold_samples_s": {t: seconds}, "pruned": {t: pruned},
            "cold_phases_s": {t: {"context": 15.6 if side == "baseline_zstd" else 16.0}}}


def test_the_pruned_row_is_judged_for_nvidia_and_reported_with_its_phases() -> None:
    p = {"ours": _pruned("ours", [74.0, 70.0, 71.0], [10, 10, 10]),
         "baseline_zstd": _pruned("baseline_zstd", [95.0, 94.0, 99.0], [1, 1, 1])}
    found = [g for g in goals({"cold_pruned": p}, ["nvidia-cu130"]) if "pruned" in g["goal"]]
    assert [(g["goal"], g["met"], g["detail"]) for g in found] == [
        ("cold build nvidia-cu130, wheel contexts pruned first, <= 0.7 x the strong baseline exported with zstd",
         False, "71.0 s vs 95.0 s (0.75 x)")]
    table = "\n".join(pruned_table(p))
    assert "| cold build (s; samples [74.0, 70.0, 71.0] / [95.0, 94.0, 99.0]) | nvidia-cu130 | 71.0 | 95.0 |" in table
    assert "| copies pruned before each build | nvidia-cu130 | [10, 10, 10] | [1, 1, 1] |" in table
    assert "| of it: BuildKit's context (s, median) | nvidia-cu130 | 16.0 | 15.6 |" in table
    results = {"cold_pruned": p, "goals": found, "cpus": 2, "engine": "26.1.5", "seconds": 1}
    assert table in markdown(results, ["nvidia-cu130"])
