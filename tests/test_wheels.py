"""Wheel resolution pieces that need no engine: platform tags, lock files, lock reuse."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import fetch_wheels, run_builder

from builder.config.errors import TargetFailed
from builder.config.project import load_project
from builder.oci.registry import Ref
from builder.wheels import contexts, lockfile, locks, resolve, wheelhouse


@pytest.fixture
def proj(project):
    return load_project(project / "matrix.yaml")


@pytest.mark.parametrize(("platform", "arch"), [("linux/amd64", "x86_64"), ("linux/arm64", "aarch64")])
def test_platform_args_list_every_manylinux_tag_of_the_image_glibc(proj, platform, arch):
    args = resolve.platform_args(proj, platform)
    tags = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert tags[0] == f"manylinux_2_36_{arch}"  # bookworm's glibc, the image platform's machine
    assert f"manylinux_2_28_{arch}" in tags and f"manylinux_2_17_{arch}" in tags and f"manylinux_2_5_{arch}" in tags
    assert {f"manylinux2014_{arch}", f"manylinux1_{arch}"} <= set(tags)
    assert "--only-binary=:all:" in args and args[args.index("--python-version") + 1] == "3.11"


def test_lock_round_trip(tmp_path):
    pins = [lockfile.Pin("torch", "2.13.0+cpu", "a" * 64, "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"),
            lockfile.Pin("Accelerate", "1.0", "b" * 64, "accelerate-1.0-py3-none-any.whl")]
    path = tmp_path / "requirements.lock"
    lockfile.write_lock(path, "target cpu", "sha256:f00", pins)
    fingerprint, read = lockfile.read_lock(path)
    assert fingerprint == "sha256:f00"
    assert [p.name for p in read] == ["Accelerate", "torch"]  # sorted by canonical name
    assert set(read) == set(pins)
    assert "--hash=sha256:" + "a" * 64 in path.read_text()


def _house_with(tmp_path, monkeypatch, files: dict[str, bytes]):
    """A private wheelhouse holding *files*, fetched by the builder; returns its path."""
    house = tmp_path / "house"
    house.mkdir()
    monkeypatch.setenv("BUILDER_WHEELHOUSE", str(house))
    fetch_wheels(files)
    return house


def _downloads(args: list[str]) -> Path:
    """The folder ``pip download -d`` writes into."""
    folder = Path(args[args.index("-d") + 1])
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _no_resolve():
    pytest.fail("re-resolved although the lock's inputs are unchanged")


def _pin(name: str, version: str, data: bytes, filename: str) -> lockfile.Pin:
    return lockfile.Pin(name, version, hashlib.sha256(data).hexdigest(), filename)


def test_unchanged_lock_is_reused_without_pip(proj, tmp_path, monkeypatch):
    """A no-op build must not re-resolve: with inputs unchanged and wheels present, pip never runs."""
    pins = [_pin("uv", "0.13.9", b"stand-in wheel", "uv-0.13.9-py3-none-any.whl")]
    _house_with(tmp_path, monkeypatch, {pins[0].filename: b"stand-in wheel"})
    lock = tmp_path / "tools.lock"
    lockfile.write_lock(lock, "tools", "sha256:same", pins)

    def no_pip(*_a, **_k):
        raise AssertionError("pip ran although the lock was current")

    monkeypatch.setattr(resolve, "_pip", no_pip)
    assert locks._ensure(proj, "linux/amd64", lock, "tools", "sha256:same", lambda: no_pip()) == pins
    with pytest.raises(AssertionError, match="pip ran"):
        locks._ensure(proj, "linux/amd64", lock, "tools", "sha256:changed", lambda: no_pip())


def test_every_lock_is_per_platform_in_name_and_fingerprint(proj, monkeypatch):
    """The same inputs for another platform (arm64) resolve other wheels: no lock may be shared across."""
    seen: dict[str, list[str]] = {}

    def record(_project, _platform, path, _what, fingerprint, _resolver, _index=None, fetch=True):
        seen.setdefault(path.name.replace("arm64", "ARCH").replace("amd64", "ARCH"), []).append(fingerprint)
        return []

    monkeypatch.setattr(locks, "_ensure", record)
    monkeypatch.setattr(locks, "check_torch_flavour", lambda *_a: None)
    gpu = proj.target("nvidia-cu130")
    for platform in ("linux/amd64", "linux/arm64"):
        locks.tools_lock(proj, platform)
        locks.common_lock(proj, platform)
        locks.target_lock(proj, gpu.on(platform), [])
    assert set(seen) == {"tools.ARCH.lock", "common.ARCH.lock", "requirements.ARCH.lock"}
    for name, (x86, arm) in seen.items():
        assert x86 != arm, f"{name}: the fingerprint ignores the platform"


def test_target_fingerprint_ignores_the_order_of_the_common_pins(proj, monkeypatch):
    """Just resolved, common pins come in pip's order; read back, in lock order: same inputs, same lock."""
    seen: list[str] = []

    def ensure(_p, _pl, _path, _w, fp: str, *_a, **_k) -> list[lockfile.Pin]:
        seen.append(fp)
        return []

    monkeypatch.setattr(locks, "_ensure", ensure)
    monkeypatch.setattr(locks, "check_torch_flavour", lambda *_a: None)
    common = [lockfile.Pin("PyYAML", "6.0.4", "a" * 64, "y.whl"), lockfile.Pin("numpy", "1.2", "b" * 64, "n.whl")]
    locks.target_lock(proj, proj.target("cpu").default_view, common)
    locks.target_lock(proj, proj.target("cpu").default_view, common[::-1])
    assert seen[0] == seen[1]


def test_fetching_locked_wheels_uses_the_image_platform_tags(proj, tmp_path, monkeypatch):
    """A fresh machine fetches the files resolution picked (image platform), not the host's best match."""
    data = b"locked wheel"
    pin = _pin("psutil", "7.2.2", data, "psutil-7.2.2-cp36-abi3-manylinux_2_28_x86_64.whl")
    _house_with(tmp_path, monkeypatch, {})
    lock = tmp_path / "common.lock"
    lockfile.write_lock(lock, "common", "sha256:same", [pin])
    calls = []

    def fake_pip(args, env=None):
        calls.append(args)
        (_downloads(args) / pin.filename).write_bytes(data)
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(resolve, "_pip", fake_pip)
    assert locks._ensure(proj, "linux/amd64", lock, "common", "sha256:same", _no_resolve) == [pin]
    (argv,) = calls
    assert argv[0] == "download" and "--require-hashes" in argv
    expected = resolve.platform_args(proj, "linux/amd64")
    tags = [expected[i + 1] for i, a in enumerate(expected) if a == "--platform"]
    got_tags = [argv[i + 1] for i, a in enumerate(argv) if a == "--platform"]
    assert got_tags == tags and tags
    assert argv[argv.index("--python-version") + 1] == proj.matrix.python
    assert argv[argv.index("--implementation") + 1] == "cp" and "--only-binary=:all:" in argv


def test_truncated_wheel_is_detected_and_fetched_again(proj, tmp_path, monkeypatch):
    """A wheel cut short (interrupted copy, full disk) is never trusted because its name exists."""
    data = b"the whole wheel, every byte of it"
    pin = _pin("torch", "2.13.0+cpu", data, "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    house = _house_with(tmp_path, monkeypatch, {pin.filename: data[:9]})
    lock = tmp_path / "requirements.lock"
    lockfile.write_lock(lock, "target cpu", "sha256:same", [pin])
    fetched = []

    def fake_pip(args, env=None):
        req = Path(args[args.index("-r") + 1]).read_text()
        fetched.append(req)
        assert not (house / pin.filename).exists(), "the bad file must be gone before pip runs"
        (_downloads(args) / pin.filename).write_bytes(data)
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(resolve, "_pip", fake_pip)
    assert locks._ensure(proj, "linux/amd64", lock, "target cpu", "sha256:same", _no_resolve) == [pin]
    assert fetched == [f"torch==2.13.0+cpu --hash=sha256:{pin.sha256}\n"]
    assert (house / pin.filename).read_bytes() == data

    # Verified once: a no-op rebuild neither hashes nor fetches again.
    monkeypatch.setattr(wheelhouse, "sha256_file", lambda _p: pytest.fail("re-hashed a verified wheel"))
    monkeypatch.setattr(resolve, "_pip", lambda _a, env=None: pytest.fail("fetched a verified wheel"))
    assert locks._ensure(proj, "linux/amd64", lock, "target cpu", "sha256:same", _no_resolve) == [pin]


def test_changed_wheel_is_hashed_again(proj, tmp_path, monkeypatch):
    """The stamp is per (inode, size, mtime, ctime): a file rewritten after it was verified is checked again."""
    data = b"good wheel"
    pin = _pin("uv", "0.13.9", data, "uv-0.13.9-py3-none-any.whl")
    house = _house_with(tmp_path, monkeypatch, {pin.filename: data})
    assert wheelhouse.missing([pin]) == []
    (house / pin.filename).write_bytes(b"bad")
    assert wheelhouse.missing([pin]) == [pin] and not (house / pin.filename).exists()


def test_a_large_wheel_being_hashed_says_so_once_then_is_stamped(tmp_path, monkeypatch):
    """A wheel of SAY_HASHING_BYTES or more (CUDA torch is ~0.9 GB) says it is being checked, so a long
    first check is never silent; once stamped, a no-op says nothing."""
    data = b"a large wheel"
    pin = _pin("uv", "0.13.9", data, "uv-0.13.9-py3-none-any.whl")
    _house_with(tmp_path, monkeypatch, {pin.filename: data})
    monkeypatch.setattr(wheelhouse, "SAY_HASHING_BYTES", len(data))
    said: list[str] = []
    assert wheelhouse.missing([pin], say=said.append) == []
    assert said == [f"wheelhouse: checking {pin.filename} (0.00 GB) against its locked sha256"], said
    assert wheelhouse.missing([pin], say=said.append) == [] and len(said) == 1


@pytest.mark.parametrize(
    ("target", "resolved"),
    [("nvidia-cu130", "2.14.1+cpu"), ("cpu", "2.13.0+cu118"), ("cpu", "2.13.0"), ("nvidia-cu118", "2.7.1")],
)
def test_torch_of_another_flavour_fails_the_lock(proj, monkeypatch, target, resolved):
    """``torch==X`` also matches ``X+cpu`` (ranked above bare X): the lock must refuse the wrong build."""
    t = proj.target(target).default_view
    torch = lockfile.Pin("torch", resolved, "e" * 64, f"torch-{resolved}-cp311-cp311-manylinux_2_28_x86_64.whl")
    monkeypatch.setattr(locks, "index_reachable", lambda url, timeout=8.0: None)
    monkeypatch.setattr(locks, "resolve", lambda *a, **k: [torch])
    monkeypatch.setattr(locks, "read_lock", lambda path: (None, []))
    monkeypatch.setattr(locks, "write_lock", lambda *a: pytest.fail("wrote a lock with the wrong torch"))
    with pytest.raises(TargetFailed) as exc:
        locks.target_lock(proj, t, [])
    text = str(exc.value)
    assert "\n" not in text
    assert f"target {target}" in text and f"torch {resolved}" in text and f"expected {t.torch_pin}" in text
    assert "fix:" in text and f"builder lock -t {target}" in text


@pytest.mark.parametrize(("target", "resolved"), [("nvidia-cu130", "2.14.1"), ("cpu", "2.13.0+cpu")])
def test_torch_of_the_target_flavour_is_locked(proj, monkeypatch, target, resolved):
    """PyPI's CUDA torch has no local label in its metadata (only torch.__version__ says +cu130)."""
    torch = lockfile.Pin("torch", resolved, "e" * 64, f"torch-{resolved}-cp311-cp311-manylinux_2_28_x86_64.whl")
    monkeypatch.setattr(locks, "index_reachable", lambda url, timeout=8.0: None)
    monkeypatch.setattr(locks, "resolve", lambda *a, **k: [torch])
    monkeypatch.setattr(locks, "read_lock", lambda path: (None, []))
    written = []
    monkeypatch.setattr(locks, "write_lock", lambda *a: written.append(a))
    assert locks.target_lock(proj, proj.target(target).default_view, []) == [torch]
    assert written


def test_index_reachable_reports_why(tmp_path):
    assert resolve.index_reachable(f"file://{tmp_path}") is None
    assert resolve.index_reachable(f"file://{tmp_path}/missing") == "no such folder"
    reason = resolve.index_reachable("http://127.0.0.1:9/simple", timeout=2)
    assert reason and "refused" in reason.lower()


def test_an_index_with_its_login_in_the_url_is_asked_with_that_login(tmp_path):
    """pip takes ``https://user:token@mirror/simple``; urllib reads ``user:token@mirror`` as a host and a
    port (it raised InvalidURL, or called a reachable index unreachable). A real HTTP server on loopback
    answers 200 to the login, 503 to anything else; a reason never quotes the token."""
    import base64
    import http.server
    import threading

    seen: list[str | None] = []

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            good = seen[-1] == "Basic " + base64.b64encode(b"ci:t@k3n").decode()
            self.send_response(200 if good else 503)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        assert resolve.index_reachable(f"http://ci:t%40k3n@127.0.0.1:{port}/simple", timeout=5) is None
        assert resolve.index_reachable(f"http://ci:wrong@127.0.0.1:{port}/simple", timeout=5) == "HTTP 503"
        reason = resolve.index_reachable("https://ci:s3cr3t@127.0.0.1:9/simple", timeout=2)
        assert reason and "refused" in reason.lower() and "s3cr3t" not in reason
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["Basic " + base64.b64encode(b"ci:t@k3n").decode(), "Basic " + base64.b64encode(b"ci:wrong").decode()]


def test_unreachable_index_message_names_index_and_mirror(proj, monkeypatch):
    target = proj.target("amd-rocm5.7").default_view
    monkeypatch.setattr(locks, "index_reachable", lambda url, timeout=8.0: "Name or service not known")
    monkeypatch.setattr(locks, "resolve", lambda *a, **k: (_ for _ in ()).throw(TargetFailed("no match")))
    monkeypatch.setattr(locks, "read_lock", lambda path: (None, []))
    with pytest.raises(TargetFailed) as exc:
        locks.target_lock(proj, target, [])
    text = str(exc.value)
    assert "https://download.pytorch.org/whl/rocm5.7" in text and "BUILDER_INDEX_ROCM5_7=URL" in text


@pytest.mark.parametrize(
    ("ref", "parts"),
    [
        ("localhost:5000/ml-runtime:cpu", ("localhost:5000", "ml-runtime", "cpu", None)),
        ("127.0.0.1:5000/a/b@sha256:" + "d" * 64, ("127.0.0.1:5000", "a/b", None, "sha256:" + "d" * 64)),
        ("registry.example/team/img:v1.2", ("registry.example", "team/img", "v1.2", None)),
    ],
)
def test_ref_parse(ref, parts):
    r = Ref.parse(ref)
    assert (r.host, r.repository, r.tag, r.digest) == parts


def test_the_build_context_holds_each_layer_s_wheels_and_nothing_else(tmp_path, monkeypatch):
    """One folder per layer, exactly its wheels and the marker (hard links: nothing re-hashed, nothing copied); the
    same wheels give the same folder."""
    house, pins, _layers = _staged_house(tmp_path, monkeypatch)  # verified and stamped at the download time
    folder = contexts.build_context({"tools": [pins["a"]], "torch": [pins["b"]], "packages": []})
    assert sorted(p.name for p in (folder / "torch").iterdir()) == ["LAYER", "b-1.0-py3-none-any.whl"]
    # a layer without wheels still gets a folder that is not empty (wheelhouse.MARKER says why)
    assert [p.name for p in (folder / "packages").iterdir()] == ["LAYER"]
    assert (folder / "packages" / "LAYER").read_text() == "packages\n"
    for layer, name in (("tools", "a"), ("torch", "b")):
        assert (folder / layer / f"{name}-1.0-py3-none-any.whl").samefile(house / f"{name}-1.0-py3-none-any.whl")
    monkeypatch.setattr(wheelhouse, "sha256_file", lambda path: pytest.fail(f"{path} hashed again"))
    assert wheelhouse.missing(list(pins.values())) == []
    assert contexts.build_context({"tools": [pins["a"]], "torch": [pins["b"]], "packages": []}) == folder


def test_a_layer_s_folder_has_the_same_times_in_every_context_that_holds_it(tmp_path, monkeypatch):
    """buildah (podman 5.4.2) keys a RUN mounting a build context on its files' and folder's mtimes: a lock that
    gained a package staged a new context whose unchanged layers (tools, torch) had a new folder and marker time,
    and their layers missed the cache (cpu: 5 of 23 steps cached). The same wheels now give the same times."""
    _house, pins, _layers = _staged_house(tmp_path, monkeypatch)
    first = contexts.build_context({"tools": [pins["a"]], "torch": [], "packages": []})
    time.sleep(0.02)
    second = contexts.build_context({"tools": [pins["a"]], "torch": [], "packages": [pins["b"]]})
    assert first != second

    def times(folder):
        return {(entry.name, entry.stat().st_mtime_ns, oct(entry.stat().st_mode)) for entry in os.scandir(folder)}

    for layer in ("tools", "torch"):
        assert (first / layer).stat().st_mtime_ns == (second / layer).stat().st_mtime_ns
        assert times(first / layer) == times(second / layer)
    assert (second / "packages" / "LAYER").stat().st_mtime == contexts.FIXED_MTIME
    # a folder staged before the times were fixed gets them when it is used again, its wheels untouched
    os.utime(first / "tools" / "LAYER", (1, 1))
    os.utime(first / "tools", (1, 1))
    wheel = (first / "tools" / pins["a"].filename).stat()
    assert contexts.build_context({"tools": [pins["a"]], "torch": [], "packages": []},
                                    say=lambda s: pytest.fail(s)) == first
    assert times(first / "tools") == times(second / "tools")
    assert (first / "tools").stat().st_mtime == contexts.FIXED_MTIME
    assert (first / "tools" / pins["a"].filename).stat().st_mtime_ns == wheel.st_mtime_ns


def _staged_house(tmp_path, monkeypatch):
    """A private wheelhouse with two verified wheels; returns (house, {name: pin}, layers)."""
    monkeypatch.setenv("BUILDER_WHEELHOUSE", str(tmp_path / "house"))
    house = wheelhouse.location()
    pins = {}
    for name in ("a", "b"):
        data = name.encode() * 100
        fetch_wheels({f"{name}-1.0-py3-none-any.whl": data})
        pins[name] = lockfile.Pin(name, "1.0", hashlib.sha256(data).hexdigest(), f"{name}-1.0-py3-none-any.whl")
    assert wheelhouse.missing(list(pins.values())) == []
    return house, pins, {"tools": [pins["a"]], "torch": [pins["b"]], "packages": []}


def _alter(path, *, in_place: bool, keep_mtime: bool = True) -> None:
    """Flip one byte of *path* (same size): in place (same inode) or as a new file; mtime kept or not."""
    time.sleep(0.02)  # past the kernel's coarse timestamp tick: the change gets a ctime of its own
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF
    if in_place:
        with path.open("r+b") as handle:
            handle.write(bytes(data))
    else:
        path.unlink()
        path.write_bytes(bytes(data))
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_a_wheel_altered_in_place_with_its_mtime_reset_is_hashed_again(tmp_path, monkeypatch):
    """Same size, same inode, mtime set back: only the ctime tells (pip's and uv's stamp); the line names it."""
    house, pins, _ = _staged_house(tmp_path, monkeypatch)
    _alter(house / pins["a"].filename, in_place=True)
    said: list[str] = []
    assert wheelhouse.missing(list(pins.values()), say=said.append) == [pins["a"]]
    assert not (house / pins["a"].filename).exists()
    assert len(said) == 1 and pins["a"].filename in said[0] and "fetching it again" in said[0]


def test_staging_moves_no_stamp_so_nothing_is_hashed_again(tmp_path, monkeypatch):
    """A hard link moves its file's ctime: the stamps follow, or every build would re-hash torch."""
    _, pins, layers = _staged_house(tmp_path, monkeypatch)
    folder = contexts.build_context(layers, say=lambda s: pytest.fail(s))
    contexts.build_context({"torch": [pins["a"], pins["b"]]}, say=lambda s: pytest.fail(s))  # more links
    monkeypatch.setattr(wheelhouse, "sha256_file", lambda path: pytest.fail(f"{path} hashed again"))
    assert wheelhouse.missing(list(pins.values())) == []
    assert contexts.build_context(layers, say=lambda s: pytest.fail(s)) == folder


@pytest.mark.parametrize("how", ["replaced, same size and mtime", "replaced", "extra file", "removed", "marker"])
def test_a_damaged_staged_folder_is_replaced_never_reused(tmp_path, monkeypatch, how):
    """A staged folder is used only if every file in it checks out; else a fresh one takes its place
    (the old removed), whose changed files have a size or mtime BuildKit has not synced yet."""
    house, pins, layers = _staged_house(tmp_path, monkeypatch)
    folder = contexts.build_context(layers)
    staged = folder / "torch" / pins["b"].filename
    if how.startswith("replaced"):
        _alter(staged, in_place=False, keep_mtime="mtime" in how)
    elif how == "extra file":
        (folder / "torch" / "c-1.0-py3-none-any.whl").write_bytes(b"c")
        staged = folder / "torch" / "c-1.0-py3-none-any.whl"
    elif how == "removed":
        staged.unlink()
    else:
        staged = folder / "torch" / wheelhouse.MARKER
        staged.write_text("tools\n")
    old = staged.stat() if staged.exists() else None
    said: list[str] = []
    assert contexts.build_context(layers, say=said.append) == folder
    assert len(said) == 1 and str(staged) in said[0] and "afresh" in said[0], said
    assert sorted(p.name for p in (folder / "torch").iterdir()) == ["LAYER", pins["b"].filename]
    assert (folder / "torch" / pins["b"].filename).samefile(house / pins["b"].filename)
    assert (folder / "torch" / "LAYER").read_text() == "torch\n"
    if how.startswith("replaced"):
        new = (folder / "torch" / pins["b"].filename).stat()
        assert old is not None  # it was there before it was replaced
        assert (new.st_size, new.st_mtime_ns) != (old.st_size, old.st_mtime_ns), "BuildKit would keep its copy"
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name], "the old folder is left"
    assert contexts.build_context(layers, say=said.append) == folder and len(said) == 1  # now it checks out


def test_a_staged_folder_of_a_wheel_fetched_again_is_replaced(tmp_path, monkeypatch):
    """The user's case: a wheel altered in place (its staged hard link with it) is fetched again; the
    staged folder still holds the altered inode, so it is replaced."""
    house, pins, layers = _staged_house(tmp_path, monkeypatch)
    folder = contexts.build_context(layers)
    path = house / pins["a"].filename
    good = path.read_bytes()
    _alter(path, in_place=True, keep_mtime=False)
    assert wheelhouse.missing(list(pins.values()), say=lambda s: None) == [pins["a"]]
    fetch_wheels({path.name: good})
    assert wheelhouse.missing(list(pins.values())) == []
    said: list[str] = []
    contexts.build_context(layers, say=said.append)
    assert len(said) == 1 and pins["a"].filename in said[0]
    assert (folder / "tools" / path.name).read_bytes() == good


def test_a_wheel_altered_after_its_fetch_fails_the_staging_with_its_name(tmp_path, monkeypatch):
    house, pins, layers = _staged_house(tmp_path, monkeypatch)
    _alter(house / pins["b"].filename, in_place=True)
    with pytest.raises(TargetFailed, match=re.escape(pins["b"].filename) + ".*run the build again"):
        contexts.build_context(layers)
    assert not (house / pins["b"].filename).exists()


def test_copies_across_file_systems_carry_their_own_stamps(tmp_path, monkeypatch):
    """Where a hard link fails (another file system), the copy is stamped in the folder itself."""
    house, pins, layers = _staged_house(tmp_path, monkeypatch)

    def no_link(*_a):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    folder = contexts.build_context(layers)
    copy = folder / "torch" / pins["b"].filename
    assert not copy.samefile(house / pins["b"].filename)
    monkeypatch.setattr(wheelhouse, "sha256_file", lambda path: pytest.fail(f"{path} hashed again"))
    assert contexts.build_context(layers, say=lambda s: pytest.fail(s)) == folder
    _alter(copy, in_place=True)
    said: list[str] = []
    contexts.build_context(layers, say=said.append)
    assert len(said) == 1 and str(copy) in said[0]
    assert copy.read_bytes() == (house / pins["b"].filename).read_bytes()


def test_a_killed_run_s_staging_folders_and_temporary_files_are_removed(tmp_path, monkeypatch):
    house, _, layers = _staged_house(tmp_path, monkeypatch)
    (house / ".contexts" / ".staging-x1y2z3" / "torch").mkdir(parents=True)
    (house / ".contexts" / ".staging-x1y2z3" / "torch" / "LAYER").write_text("torch\n")
    (house / f".{wheelhouse.LEDGER}.k2j3h4g5.tmp").write_text('{"half": [')
    (house / ".staging-a-1.0-py3-none-any.whl").write_bytes(b"half a copy")
    folder = contexts.build_context(layers)
    assert sorted(p.name for p in (house / ".contexts").iterdir()) == [folder.name]
    assert sorted(p.name for p in house.glob(".*")) == [".contexts", ".ledger.json", ".lock"]


def test_a_damaged_ledger_only_costs_a_hash_and_owns_nothing(tmp_path, monkeypatch):
    """Atomic writes never leave a half-written ledger, but a damaged one (a full disk, a hand edit) proves
    nothing: the wheels are hashed once more and used, and never removed as the builder's."""
    house, pins, _ = _staged_house(tmp_path, monkeypatch)
    (house / wheelhouse.LEDGER).write_text('{"records": {"a-1.0-py3-none-any.whl": [1, ')
    assert wheelhouse.missing(list(pins.values())) == []
    records = json.loads((house / wheelhouse.LEDGER).read_text())["records"]
    assert set(records) == {p.filename for p in pins.values()}
    assert all("verified" in r["facts"] and "fetched" not in r["facts"] for r in records.values())
    assert wheelhouse.remove_wheels(p.filename for p in pins.values()) == []


def test_removing_a_staged_folder_keeps_the_stamps_of_its_wheels(tmp_path, monkeypatch):
    """``builder gc`` removes a folder no lock references: the unlink moves its wheels' ctimes, the
    stamps follow, so no build hashes them again."""
    _, pins, layers = _staged_house(tmp_path, monkeypatch)
    kept = contexts.build_context({"torch": [pins["a"], pins["b"]]})
    gone = contexts.build_context(layers)
    contexts.remove_context(gone)
    assert not gone.exists() and kept.exists()
    monkeypatch.setattr(wheelhouse, "sha256_file", lambda path: pytest.fail(f"{path} hashed again"))
    assert wheelhouse.missing(list(pins.values())) == []
    assert contexts.build_context({"torch": [pins["a"], pins["b"]]}, say=lambda s: pytest.fail(s)) == kept


@pytest.mark.parametrize("how", ["../ up to /", "absolute"])
def test_a_lock_line_naming_a_path_is_bad_input_and_nothing_outside_is_touched(project, tmp_path, how):
    """A lock line's ``# <file>`` names a file in the wheelhouse: one naming ``../../…/victim.whl`` (or
    ``/…/victim.whl``) with a wrong hash made the builder hash that file, find it wrong and delete it.
    It is bad input, said before anything is fetched: exit 2, one line naming the lock file and line."""
    house = tmp_path / "house"
    house.mkdir()
    victim = tmp_path / "elsewhere" / "victim-1.0-py3-none-any.whl"
    victim.parent.mkdir()
    victim.write_bytes(b"not the builder's")
    named = str(victim) if how == "absolute" else "../" * len(house.parts) + str(victim).lstrip("/")
    assert (house / named).resolve() == victim
    lock = project / "images" / "cpu" / "requirements.amd64.lock"
    lines = lock.read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if line.startswith("torch=="))
    lines[number - 1] = re.sub(r"  # \S+", f"  # {named}", lines[number - 1])
    lock.write_text("\n".join(lines) + "\n")
    proc = run_builder("lock", "-t", "cpu", "--platform", "linux/amd64", cwd=project,
                       env={"BUILDER_WHEELHOUSE": str(house), "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert proc.returncode == 2, proc.stderr[-2000:]
    where = "images/cpu/requirements.amd64.lock"
    said = (f"error: {where} line {number}: {named!r} is not {lockfile.WHEEL_NAME}; a lock names wheels in the "
            f"wheelhouse, never paths: delete {where} and run `builder lock` to resolve it again")
    assert proc.stderr.splitlines() == [said]
    assert victim.read_bytes() == b"not the builder's"
    assert not [p for p in house.iterdir() if not p.name.startswith(".")], "nothing was fetched"


def test_a_file_the_builder_did_not_fetch_is_used_if_it_matches_and_never_removed(tmp_path, monkeypatch):
    """A wheelhouse shared beyond the builder (BUILDER_WHEELHOUSE=/srv/team-wheels) holds others' files:
    one with the locked bytes is used; one with other bytes under a locked name is left as it is, and
    the build fails naming it and the fix."""
    house = _house_with(tmp_path, monkeypatch, {})
    good, other = _pin("a", "1.0", b"a" * 100, "a-1.0-py3-none-any.whl"), _pin("b", "1.0", b"b" * 100,
                                                                              "b-1.0-py3-none-any.whl")
    (house / good.filename).write_bytes(b"a" * 100)  # theirs, the same bytes as the lock's
    (house / other.filename).write_bytes(b"their own b")  # theirs, other bytes
    assert wheelhouse.missing([good]) == []
    assert contexts.build_context({"torch": [good]}).joinpath("torch", good.filename).samefile(house / good.filename)
    with pytest.raises(TargetFailed, match=re.escape(f"{house / other.filename} is not the locked wheel") +
                       ".*not a file the builder fetched.*BUILDER_WHEELHOUSE"):
        wheelhouse.missing([other])
    assert (house / other.filename).read_bytes() == b"their own b"
    assert wheelhouse.remove_wheels([good.filename, other.filename]) == []
    assert (house / good.filename).exists() and (house / other.filename).exists()



def test_a_run_that_ends_holds_nothing_in_the_wheelhouse(tmp_path, monkeypatch):
    """A run holds what it staged while it lives; when it exits it lets go of it in the ledger itself, so
    a user who cannot read its lease (a wheelhouse shared beyond one user) never finds it held for good."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    house, _pins, layers = _staged_house(tmp_path, monkeypatch)
    wheelhouse.release()  # this process's own hold (it verified them)
    stage = ("import json, sys; from builder.wheels import contexts; from builder.wheels.lockfile import Pin; "
             "print(contexts.build_context({k: [Pin(**p) for p in v] for k, v in json.loads(sys.argv[1]).items()}))")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    out = subprocess.run([sys.executable, "-c", stage, json.dumps({k: [vars(p) for p in v] for k, v in layers.items()})],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    records = json.loads((house / wheelhouse.LEDGER).read_text())["records"]
    assert records[f".contexts/{Path(out).name}"]["clones"] == {}  # staged, by no clone named
    assert {key: r["runs"] for key, r in records.items() if r["runs"]} == {}
