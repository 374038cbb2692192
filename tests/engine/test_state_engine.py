"""The state a build keeps on the machine heals itself: a damaged wheel in the wheelhouse or in a
staged folder, a killed run's smoke container, two builds of one target at once.

Each test builds cpu in its own project copy (its own registry repository), with a wheelhouse of
its own (``BUILDER_WHEELHOUSE``: copies of cpu's locked wheels, never the shared one, which these
tests damage). A change under ``runtime/`` makes a build really run (its content tag is new)
while the wheel layers stay BuildKit's to take from cache when their context holds the right bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from helpers import fetch_wheels, publish_base_to, remove_clone_images, run_builder

from builder.config.ownership import run_token
from builder.images import execute
from builder.images.smoke import SMOKE_LABEL
from builder.wheels import lockfile, wheelhouse
from devtools.support import copy_project, edit_matrix, fail_or_skip, host_platform, registry_of

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def _locked_wheels(root: Path) -> list[lockfile.Pin]:
    arch = host_platform().split("/")[1]
    return [pin for lock in (f"images/tools.{arch}.lock", f"images/common.{arch}.lock",
                             f"images/cpu/requirements.{arch}.lock") for pin in lockfile.read_lock(root / lock)[1]]


@pytest.fixture(scope="module")
def state_project(based_project, engine, tmp_path_factory):
    """(project root, its env with a private wheelhouse of copies): cpu built once there (no smoke).
    Each test leaves it as healthy as it found it."""
    tmp_path = tmp_path_factory.mktemp("state")
    root = copy_project(tmp_path / "p")
    doc = edit_matrix(root, registry=registry_of(based_project) + f"-state-{uuid.uuid4().hex[:6]}")
    publish_base_to(engine, based_project, root, doc["registry"])
    shared, house = _shared_wheelhouse(), tmp_path / "house"
    house.mkdir()
    # Copies, brought in as the builder fetches (its own: it may remove one it finds damaged); damaging
    # them must not touch the shared wheelhouse. A wheel the shared one lacks, the first build fetches.
    fetch_wheels({p.filename: shared / p.filename for p in _locked_wheels(root) if (shared / p.filename).exists()},
                 house=house)
    env = {"BUILDER_WHEELHOUSE": str(house)}
    first = run_builder("build", "-t", "cpu", "--no-smoke", cwd=root, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    yield root, env
    for image in engine.client.images.list(name=doc["registry"]):
        for tag in image.tags:
            if tag.startswith(doc["registry"] + ":"):
                engine.client.api.remove_image(tag, noprune=True)
    remove_clone_images(engine, root)


def _shared_wheelhouse() -> Path:
    return Path(os.environ.get("BUILDER_WHEELHOUSE") or wheelhouse.location())


def _change_runtime(root: Path) -> None:
    with (root / "runtime/ml_runtime/errors.py").open("a") as handle:
        handle.write(f"\n# {uuid.uuid4().hex}: a change the image carries\n")


def _flip_byte(path: Path, at: float = 0.5) -> None:
    """One byte flipped in place (same inode, same size), as the user's damaged wheel."""
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0xFF
    with path.open("r+b") as handle:
        handle.write(bytes(data))


def _pin(root: Path, name: str) -> lockfile.Pin:
    return next(p for p in _locked_wheels(root) if p.name.lower() == name)


def _staged(house: Path, filename: str) -> Path:
    (found,) = house.glob(f".contexts/*/*/{filename}")
    return found


def _lines_naming(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if name in line]


def test_a_wheel_altered_in_place_in_the_wheelhouse_is_fetched_again_and_the_build_passes(state_project):
    """The user's case: the wheelhouse file (and with it its staged hard link) damaged in place. The
    wheel is fetched again and the staged folder replaced; on main the folder kept the damaged inode
    and uv failed with a deflate error, build after build."""
    root, env = state_project
    house, pin = Path(env["BUILDER_WHEELHOUSE"]), _pin(root, "accelerate")
    _flip_byte(house / pin.filename)
    _change_runtime(root)
    proc = run_builder("build", "-t", "cpu", "--no-smoke", cwd=root, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = _lines_naming(proc.stderr, pin.filename)
    assert any("fetching it again" in line for line in said), proc.stderr[-3000:]
    assert any("afresh" in line for line in said), proc.stderr[-3000:]
    assert wheelhouse.sha256_file(_staged(house, pin.filename)) == pin.sha256


def test_a_wheel_altered_in_a_staged_folder_is_staged_again_and_the_build_passes(state_project):
    """A staged file replaced by a damaged one (a new inode, the wheelhouse intact): the folder is
    staged afresh, in one line naming the file; on main it was used as it was and uv failed."""
    root, env = state_project
    house, pin = Path(env["BUILDER_WHEELHOUSE"]), _pin(root, "accelerate")
    staged = _staged(house, pin.filename)
    damaged = staged.with_name("damaged")
    shutil.copyfile(staged, damaged)
    _flip_byte(damaged, at=0.3)  # not the byte the test above flips: a folder it left damaged stays damaged
    damaged.replace(staged)
    _change_runtime(root)
    proc = run_builder("build", "-t", "cpu", "--no-smoke", cwd=root, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = _lines_naming(proc.stderr, pin.filename)
    assert str(staged) in line and "afresh" in line
    assert _staged(house, pin.filename).samefile(house / pin.filename)


def _new_pid_namespace() -> list[str]:
    """The prefix that runs a command in a PID namespace of its own, with its own /proc: a process there
    sees none of this one's, and this one knows it by another PID (as root; else in a user namespace)."""
    if shutil.which("unshare") is None:
        fail_or_skip("unshare (util-linux) is not installed")
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--pid", "--fork", "--mount-proc"]


def test_a_killed_run_s_smoke_container_is_removed_by_the_next_run(state_project, engine, tmp_path):
    """SIGKILL to the builder during the smoke test (a CI runner's timeout) leaves its smoke container; the
    next run removes it, and nothing else: not a live run's smoke container, not one of an unknown or
    another machine's run, not a container without the label. The killed run ran in a PID namespace of
    its own (a container job, or /proc mounted hidepid: a process the reaper cannot see): while it lived,
    the reaper here and one in yet another PID namespace left its container; once killed, the next build
    here removed it (on main, whose label named a PID and its namespace, it stayed for good).

    The runs here have a state folder of their own (their leases): the engine is shared, and another
    user's or clone's smoke containers (the same label, other leases) are never taken for this run's."""
    root, env = state_project
    runs = tmp_path / "state"
    env = {**env, "XDG_CACHE_HOME": str(runs)}
    image = engine.client.images.list(name=registry_of(root))[0].id
    other_machine = "0123456789abcdef:" + run_token().partition(":")[2]
    decoys = [engine.client.api.create_container(image, ["true"], labels=labels)["Id"]
              for labels in ({SMOKE_LABEL: run_token()}, {SMOKE_LABEL: "1"}, {SMOKE_LABEL: other_machine}, {})]
    try:
        _change_runtime(root)
        log = tmp_path / "killed.log"
        with log.open("w") as stderr:  # a file, not a pipe nobody reads while it builds
            proc = subprocess.Popen([*_new_pid_namespace(), sys.executable, "-m", "builder", "build", "-t", "cpu", "-q"],
                                    cwd=root, env={**os.environ, **env}, start_new_session=True,
                                    stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + 900
        while not (smoking := _smoke_containers(engine, decoys, runs)):
            assert proc.poll() is None, f"the build ended before its smoke test: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "no smoke container in 900 s"
            time.sleep(0.2)
        assert smoking[0] not in execute.remove_orphans(engine, lambda line: None), "the reaper removed a live run's"
        reap = ("from builder.images.execute import remove_orphans; from builder.oci.docker import DockerEngine; "
                "print(' '.join(remove_orphans(DockerEngine.from_env(), lambda line: None)))")
        reaper = subprocess.run([*_new_pid_namespace(), sys.executable, "-c", reap],
                                capture_output=True, text=True, cwd=root, env={**os.environ, **env}, check=False)
        assert reaper.returncode == 0, reaper.stderr[-2000:]
        assert smoking[0] not in reaper.stdout.split(), "a reaper that cannot see the run removed its container"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert _smoke_containers(engine, decoys, runs) == smoking, "the killed run's smoke container is there"
        again = run_builder("build", "-t", "cpu", "-q", cwd=root, env=env)
        assert again.returncode == 0, again.stderr[-3000:]
        assert not _smoke_containers(engine, decoys, runs), "the killed run's smoke container is left"
        (line,) = [ln for ln in again.stderr.splitlines() if "smoke container" in ln]
        assert smoking[0][:12] in line and "killed run" in line
        assert {c["Id"] for c in engine.client.api.containers(all=True)} >= set(decoys), "removed a container not its own"
    finally:
        for cid in decoys + _smoke_containers(engine, decoys, runs):
            engine.client.api.remove_container(cid, force=True)


def _smoke_containers(engine, besides: list[str], state: Path | None = None) -> list[str]:
    """The smoke containers on the engine, *besides* those; with *state*, only those of runs whose lease
    is in that state folder (the engine is shared: others' runs have smoke containers too)."""
    return [c["Id"] for c in engine.client.api.containers(all=True, filters={"label": SMOKE_LABEL})
            if c["Id"] not in besides and (state is None or f"{state}/" in (c.get("Labels") or {}).get(SMOKE_LABEL, ""))]


@pytest.mark.timeout(2400)  # three rounds of two builds with their smoke tests, side by side on 2 cores
def test_two_builds_of_one_target_at_once_both_pass(state_project, engine):
    """Two ``builder build -t cpu`` started together after a change under runtime/ (two terminals, two
    CI jobs on one runner), three rounds: both pass, with the same image, and leave nothing staged
    half-way."""
    root, env = state_project
    house = Path(env["BUILDER_WHEELHOUSE"])
    for round_ in range(3):
        _change_runtime(root)
        procs = [subprocess.Popen([sys.executable, "-m", "builder", "build", "-t", "cpu", "--json", "-q"], cwd=root,
                                  env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for _ in range(2)]
        outs = [p.communicate(timeout=1500) for p in procs]
        for p, (_, err) in zip(procs, outs, strict=True):
            assert p.returncode == 0, f"round {round_}: {err[-3000:]}"
        ids = {json.loads(out)[0]["image_id"] for out, _ in outs}
        assert len(ids) == 1, f"round {round_}: two images of one content: {ids}"
    assert not list((house / ".contexts").glob(f"{wheelhouse.STAGING}*"))
    assert not _smoke_containers(engine, [])
