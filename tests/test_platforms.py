"""Platforms: matrix keys, per-platform views, locks and content tags, and the emulation check.

The binfmt_misc trees here are laid out as the kernel writes /proc/sys/fs/binfmt_misc (one file
per handler: enabled/disabled, interpreter, flags, offset, magic, mask); this machine's real one
is checked by ``builder doctor`` in the engine tests' hosts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from builder.config import platforms
from builder.config.errors import UserError
from builder.config.project import load_project
from builder.host.doctor import Context, check_emulation
from builder.images import content, render

HANDLER = """enabled
interpreter /usr/libexec/qemu-binfmt/{machine}-binfmt-P
flags: {flags}
offset 0
magic 7f454c460201010000000000000000000200b700
mask ffffffffffffff00fffffffffffffffffeffffff
"""
FOREIGN = "linux/arm64" if platforms.host_platform() == "linux/amd64" else "linux/amd64"


def _binfmt(tmp_path: Path, flags: str | None, state: str = "enabled") -> Path:
    folder = tmp_path / "binfmt_misc"
    folder.mkdir()
    (folder / "status").write_text("enabled\n")
    if flags is not None:
        text = HANDLER.format(machine=platforms.machine(FOREIGN), flags=flags).replace("enabled", state, 1)
        (folder / f"qemu-{platforms.machine(FOREIGN)}").write_text(text)
    return folder


def _edit(project: Path, **changes: object) -> None:
    doc = yaml.safe_load((project / "matrix.yaml").read_text())
    doc.update(changes)
    (project / "matrix.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def test_the_repo_matrix_builds_nvidia_cu130_for_both_architectures(project):
    proj = load_project(project / "matrix.yaml")
    assert proj.target("nvidia-cu130").platforms == ["linux/amd64", "linux/arm64"]
    assert proj.target("cpu").platforms == ["linux/amd64"]  # no +cpu aarch64 wheel on reachable indexes
    assert [v.unit for v in proj.views(["nvidia-cu130"], ["linux/arm64"])] == ["nvidia-cu130 (linux/arm64)"]
    assert set(proj.base_refs) == {"linux/amd64", "linux/arm64"}


def test_platforms_default_to_the_host_s(project):
    _edit(project, platforms=None)
    doc = yaml.safe_load((project / "matrix.yaml").read_text())
    doc.pop("platforms")
    for target in doc["targets"]:
        target.pop("platforms", None)
    (project / "matrix.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    proj = load_project(project / "matrix.yaml", allow_unpinned=True)
    assert {p for t in proj.targets for p in t.platforms} == {platforms.host_platform()}


@pytest.mark.parametrize(("value", "message"), [
    (["linux/s390x"], "platforms[0]: 'linux/s390x' is not a platform: linux/amd64 or linux/arm64"),
    (["linux/amd64", "linux/amd64"], "names a platform twice"),
    ([], "platforms"),
])
def test_a_bad_platform_is_one_clear_line(project, value, message):
    _edit(project, platforms=value)
    with pytest.raises(UserError) as err:
        load_project(project / "matrix.yaml")
    assert any(message in line for line in err.value.lines), err.value.lines


def test_a_platform_the_target_lacks_is_refused_with_the_fix(project):
    proj = load_project(project / "matrix.yaml")
    with pytest.raises(UserError, match="target cpu is built for linux/amd64, not linux/arm64; add"):
        proj.views(["cpu"], ["linux/arm64"])


def test_each_view_has_its_own_lock_tags_and_content_tag(project):
    proj = load_project(project / "matrix.yaml")
    amd, arm = proj.target("nvidia-cu130").views()
    assert (amd.lock, arm.lock) == ("images/nvidia-cu130/requirements.amd64.lock",
                                    "images/nvidia-cu130/requirements.arm64.lock")
    assert arm.platform_refs == [f"{r}-arm64" for r in arm.refs]
    tags = content.content_tags(proj, [amd, arm])
    assert tags[amd.unit] != tags[arm.unit]
    assert all(t.startswith(f"{proj.matrix.registry}:nvidia-cu130-") for t in tags.values())
    # A single-platform target keeps its plain name and tags.
    (cpu,) = proj.target("cpu").views()
    assert cpu.unit == "cpu" and cpu.platform_refs == [] and cpu.local_refs == cpu.refs


def test_the_dockerfile_is_one_for_every_platform_and_names_no_pin(project):
    """The pins live in base.lock.json alone (a re-pin changes that file, never images/)."""
    proj = load_project(project / "matrix.yaml")
    text = render.render(proj, [proj.target("nvidia-cu130")]).popitem()[1]
    for platform in ("linux/amd64", "linux/arm64"):
        assert proj.base_for(platform).split("@")[1] not in text
    assert "ARG BASE\n" in text and "\nFROM ${BASE} AS tools\n" in text and "\nFROM ${BASE} AS common\n" in text
    # Each platform's wheels reach the build as arguments, from that platform's locks.
    arm64 = content.build_args(proj, proj.target("nvidia-cu130").on("linux/arm64"))
    amd64 = content.build_args(proj, proj.target("nvidia-cu130").on("linux/amd64"))
    assert arm64["BASE"] == proj.base_for("linux/arm64") and amd64["BASE"] == proj.base_for("linux/amd64")
    arm64_lock = (project / "images/nvidia-cu130/requirements.arm64.lock").read_text()
    torch_hash = arm64["WHEELS_TORCH"].split("sha256:")[1]
    assert torch_hash in arm64_lock and torch_hash not in amd64["WHEELS_TORCH"]


def test_emulation_is_found_when_qemu_is_registered_with_the_f_flag(tmp_path):
    assert platforms.emulation_problem(FOREIGN, _binfmt(tmp_path, "POF")) is None
    assert platforms.emulation_problem(platforms.host_platform(), tmp_path / "absent") is None


@pytest.mark.parametrize(("flags", "state", "says"), [
    (None, "enabled", "has no qemu-"),
    ("OCP", "enabled", "without the F flag"),
    ("POF", "disabled", "is disabled"),
])
def test_missing_emulation_names_the_fix(tmp_path, flags, state, says):
    problem = platforms.emulation_problem(FOREIGN, _binfmt(tmp_path, flags, state))
    assert problem is not None and says in problem and "apt-get install qemu-user-static" in problem


def test_doctor_reports_emulation_per_foreign_platform(project, tmp_path):
    proj = load_project(project / "matrix.yaml")
    ctx = Context(host=None, project=proj)  # type: ignore[arg-type]
    (check,) = check_emulation(ctx, _binfmt(tmp_path, None))
    assert check.status == "fail" and check.item == f"emulation {FOREIGN}"
    assert "nvidia-cu130" in check.found and "qemu-user-static" in (check.fix or "")
    ok = tmp_path / "ok"
    ok.mkdir()
    (checked,) = check_emulation(ctx, _binfmt(ok, "POF"))
    assert checked.status == "ok"


def test_content_tag_covers_emulation_and_compression(project, monkeypatch):
    """A native and an emulated build of one platform hold different bytecode layers, and zstd other
    blobs: each gets its own content tag, so neither passes for the other."""
    import dataclasses

    from builder.config import platforms as plat

    proj = load_project(project / "matrix.yaml")
    arm64 = proj.target("nvidia-cu130").on("linux/arm64")
    monkeypatch.setattr(plat, "host_platform", lambda: "linux/amd64")
    emulated = content.content_tags(proj, [arm64])[arm64.unit]
    monkeypatch.setattr(plat, "host_platform", lambda: "linux/arm64")
    native = content.content_tags(proj, [arm64])[arm64.unit]
    assert emulated != native
    gzip_ = dataclasses.replace(arm64, compression="gzip")
    assert content.content_tags(proj, [gzip_])[gzip_.unit] != native
