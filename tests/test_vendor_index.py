"""Resolving against real indexes: dependency confusion, and relocks that keep pins.

Two PEP 503 indexes on loopback, with tiny wheels built here: the vendor's ``foo==1.0``, the
default's ``foo==99`` (and ``bar``, which only the default has). A name the vendor index has
never comes from the default index. The relock tests let the indexes gain newer releases between
two locks (real uv and pip): a relock moves only the pins its change forces, and says each.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import threading
import zipfile
from collections.abc import Generator, Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from builder.config.errors import UserError
from builder.config.project import load_project
from builder.wheels import layers, lockfile, locks, resolve, wheelhouse
from devtools.support import edit_matrix


def _wheel(root: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A pure wheel of *name*==*version* (needing *requires*) on the simple index at *root* (its project page too)."""
    filename = f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    depends = "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {f"{name}/__init__.py": f"VERSION = {version!r}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{depends}",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}

    def digest(text: str) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()

    files[f"{info}/RECORD"] = "".join(f"{k},sha256={digest(v)},{len(v)}\n" for k, v in files.items()) + \
        f"{info}/RECORD,,\n"
    page = root / name
    page.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(page / filename, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    sha = hashlib.sha256((page / filename).read_bytes()).hexdigest()
    links = "".join(f'<a href="{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a>\n'
                    for w in sorted(page.glob("*.whl")))
    (page / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    assert sha


def _serve(folder: Path) -> Generator[str, None, None]:
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 partial(SimpleHTTPRequestHandler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def indexes(tmp_path, monkeypatch) -> Iterator[tuple[str, str]]:
    """(vendor, default) index URLs; the host's pip sources are only the default one."""
    _wheel(tmp_path / "vendor" / "simple", "foo", "1.0")
    _wheel(tmp_path / "default" / "simple", "foo", "99")
    _wheel(tmp_path / "default" / "simple", "bar", "2.0")
    for var in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_CERT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # no config file: only the variables below
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setenv("BUILDER_WHEELHOUSE", str(tmp_path / "house"))
    vendor_server, default_server = _serve(tmp_path / "vendor"), _serve(tmp_path / "default")
    vendor, default = next(vendor_server), next(default_server)
    monkeypatch.setenv("PIP_INDEX_URL", default)
    yield vendor, default
    for server in (vendor_server, default_server):
        server.close()


def test_a_name_the_vendor_index_has_never_comes_from_the_default_index(project, indexes, tmp_path):
    vendor, default = indexes
    proj = load_project(project / "matrix.yaml")
    pins = {p.name: p for p in resolve.resolve(proj, ["foo", "bar"], "linux/amd64", vendor_index=vendor)}
    assert (pins["foo"].version, pins["foo"].index) == ("1.0", vendor)
    assert (pins["bar"].version, pins["bar"].index) == ("2.0", default)
    assert (wheelhouse.location() / pins["foo"].filename).exists()
    # The lock records each pin's index, and reads it back.
    lock = tmp_path / "requirements.lock"
    lockfile.write_lock(lock, "target t", "sha256:x", list(pins.values()))
    assert f"# foo-1.0-py3-none-any.whl  from {vendor}" in lock.read_text()
    assert set(lockfile.read_lock(lock)[1]) == set(pins.values())


def test_a_resolution_leaves_nothing_in_the_users_uv_cache(project, indexes, tmp_path):
    """uv keeps each wheel it read unpacked in its cache (0.7 GB per torch release, in the bench's disk
    row): the builder's resolution uses a cache of its own that goes with it."""
    resolve.resolve(load_project(project / "matrix.yaml"), ["foo", "bar"], "linux/amd64")
    users = tmp_path / "uv-cache"  # UV_CACHE_DIR, as the fixture sets it
    assert not users.exists() or not any(users.rglob("*")), sorted(users.rglob("*"))[:5]


def test_a_locked_wheel_is_fetched_from_its_recorded_index(project, indexes, tmp_path):
    vendor, _default = indexes
    proj = load_project(project / "matrix.yaml")
    (foo,) = [p for p in resolve.resolve(proj, ["foo"], "linux/amd64", vendor_index=vendor)]
    (wheelhouse.location() / foo.filename).unlink()
    resolve.fetch_locked(proj, [foo], tmp_path / "x.lock", None, "linux/amd64")
    assert wheelhouse.sha256_file(wheelhouse.location() / foo.filename) == foo.sha256


def test_a_wheel_whose_recorded_index_fails_here_is_fetched_from_the_host_sources(project, indexes, tmp_path,
                                                                                   monkeypatch):
    """A lock written where another mirror answered (its lines say ``from`` that mirror) still fetches
    where that mirror does not: from the host's own sources, the same file by its hash. (A recorded
    ``file://`` mirror that is absent here is skipped by pip itself.)"""
    proj = load_project(project / "matrix.yaml")
    (bar,) = resolve.resolve(proj, ["bar"], "linux/amd64")
    (wheelhouse.location() / bar.filename).unlink()
    monkeypatch.setenv("PIP_RETRIES", "0")
    moved = dataclasses.replace(bar, index="http://127.0.0.1:9/simple")  # the discard port: refused
    resolve.fetch_locked(proj, [moved], tmp_path / "x.lock", None, "linux/amd64")
    assert wheelhouse.sha256_file(wheelhouse.location() / bar.filename) == bar.sha256


def _cpu_index(project: Path, tmp_path: Path, vendor: str, monkeypatch) -> None:
    """cpu's torch on the vendor index (needing foo), accelerate (matrix.yaml's torch_packages) on the default one."""
    _wheel(tmp_path / "vendor" / "simple", "torch", "2.13.0+cpu", requires=("foo",))
    _wheel(tmp_path / "default" / "simple", "accelerate", "1.0", requires=("torch",))
    monkeypatch.setenv("BUILDER_INDEX_CPU", vendor)  # cpu's torch index (download.pytorch.org) is this one here
    (project / "images" / "cpu" / "requirements.amd64.lock").unlink()  # the committed one pins PyPI's accelerate


def _index_moves_on(tmp_path: Path, monkeypatch, *wheels: tuple[str, str, str, tuple[str, ...]]) -> None:
    """New releases appear between two locks: (index, name, version, requires) each; uv sees the new pages."""
    for index, name, version, requires in wheels:
        _wheel(tmp_path / index / "simple", name, version, requires=requires)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / f"uv-cache-{len(list(tmp_path.glob('uv-cache*')))}"))


def _set_packages(project: Path, name: str, packages: list[str], **changes: object) -> None:
    doc = yaml.safe_load((project / "matrix.yaml").read_text())
    for t in doc["targets"]:
        if t["name"] == name:
            t["packages"] = packages
    edit_matrix(project, targets=doc["targets"], **changes)


def _lock(project: Path, name: str, said: list[str], common: list[lockfile.Pin] | None = None) -> dict[str, str]:
    proj = load_project(project / "matrix.yaml")
    pins = locks.target_lock(proj, proj.target(name).on("linux/amd64"), common or [], say=said.append)
    return {p.name: p.version for p in pins}


def _plan(project: Path, name: str) -> dict[str, tuple[lockfile.Pin, ...]]:
    """The layer plan `builder print` shows: {layer: its wheels}."""
    proj = load_project(project / "matrix.yaml")
    return {layer.name: layer.pins for layer in layers.layer_plan(proj, proj.target(name).on("linux/amd64"))}


def test_a_target_added_later_keeps_its_siblings_pins_unless_its_packages_need_others(
        project, indexes, tmp_path, monkeypatch):
    """The index moves on between two locks (foo 2.0 and accelerate 1.1 appear after cpu was locked): a
    target added later, cpu plus a package, still gets cpu's foo 1.0 and accelerate 1.0, so it shares
    cpu's torch layers; one whose own package needs foo>=2 gets foo 2.0 and nothing else moves (the
    siblings' pins are a preference, not a cap), said in one line."""
    vendor, _default = indexes
    _cpu_index(project, tmp_path, vendor, monkeypatch)
    doc = yaml.safe_load((project / "matrix.yaml").read_text())
    cpu = next(t for t in doc["targets"] if t["name"] == "cpu")
    edit_matrix(project, targets=[*doc["targets"], {**cpu, "name": "cpu-hf", "packages": ["bar"]},
                                  {**cpu, "name": "cpu-new", "packages": ["foonext"]}])
    said: list[str] = []
    assert _lock(project, "cpu", said) == {"torch": "2.13.0+cpu", "foo": "1.0", "accelerate": "1.0"}
    _index_moves_on(tmp_path, monkeypatch, ("vendor", "foo", "2.0", ()),  # from the vendor's: first-index
                    ("default", "accelerate", "1.1", ("torch",)), ("default", "foonext", "1.0", ("foo>=2",)))
    assert _lock(project, "cpu-hf", said) == {"torch": "2.13.0+cpu", "foo": "1.0", "accelerate": "1.0",
                                              "bar": "2.0"}
    assert _lock(project, "cpu-new", said) == {"torch": "2.13.0+cpu", "foo": "2.0", "accelerate": "1.0",
                                               "foonext": "1.0"}
    assert said == ["images/cpu-new/requirements.amd64.lock: foo 1.0 -> 2.0: foonext 1.0 needs foo>=2"]


def test_an_extra_package_after_the_index_moved_changes_only_the_packages_layer(
        project, indexes, tmp_path, monkeypatch):
    """cpu is locked; the index gains accelerate 1.1 (a shared dependency: every target's accelerate
    layer); cpu then gets a package: the relock keeps accelerate 1.0 and foo 1.0, so the layer plan
    differs in its last layer alone. A package that needs the newer accelerate moves it, in one line
    that says why, and nothing else."""
    vendor, _default = indexes
    _cpu_index(project, tmp_path, vendor, monkeypatch)
    said: list[str] = []
    assert _lock(project, "cpu", said) == {"torch": "2.13.0+cpu", "foo": "1.0", "accelerate": "1.0"}
    before = _plan(project, "cpu")
    _index_moves_on(tmp_path, monkeypatch, ("vendor", "foo", "2.0", ()), ("default", "accelerate", "1.1", ("torch",)),
                    ("default", "needy", "1.0", ("accelerate>=1.1",)))
    _set_packages(project, "cpu", ["bar"])
    assert _lock(project, "cpu", said) == {"torch": "2.13.0+cpu", "foo": "1.0", "accelerate": "1.0", "bar": "2.0"}
    after = _plan(project, "cpu")
    assert [name for name in before if before[name] != after[name]] == ["packages"]
    assert said == []
    _set_packages(project, "cpu", ["bar", "needy"])
    assert _lock(project, "cpu", said) == {"torch": "2.13.0+cpu", "foo": "1.0", "accelerate": "1.1", "bar": "2.0",
                                           "needy": "1.0"}
    assert said == ["images/cpu/requirements.amd64.lock: accelerate 1.0 -> 1.1: needy 1.0 needs accelerate>=1.1"]


def test_removing_a_package_moves_no_other_pin(project, indexes, tmp_path, monkeypatch):
    """cpu with two packages is locked; the index gains newer accelerate and bar; one package goes:
    the relock drops it and keeps every other pin (bar stays 1.0: the target asks for ``bar``, which
    1.0 still satisfies). A requirement that excludes the old pin moves it, and says so."""
    vendor, _default = indexes
    _cpu_index(project, tmp_path, vendor, monkeypatch)
    _wheel(tmp_path / "default" / "simple", "bar", "1.0")
    _wheel(tmp_path / "default" / "simple", "baz", "1.0")
    said: list[str] = []
    _set_packages(project, "cpu", ["bar<2", "baz"])
    assert _lock(project, "cpu", said) == {"torch": "2.13.0+cpu", "foo": "1.0", "accelerate": "1.0", "bar": "1.0",
                                           "baz": "1.0"}
    _index_moves_on(tmp_path, monkeypatch, ("default", "accelerate", "1.1", ("torch",)), ("default", "bar", "3.0", ()))
    _set_packages(project, "cpu", ["bar"])
    assert _lock(project, "cpu", said) == {"torch": "2.13.0+cpu", "foo": "1.0", "accelerate": "1.0", "bar": "1.0"}
    assert said == []
    _set_packages(project, "cpu", ["bar>=3"])
    assert _lock(project, "cpu", said) == {"torch": "2.13.0+cpu", "foo": "1.0", "accelerate": "1.0", "bar": "3.0"}
    assert said == ["images/cpu/requirements.amd64.lock: bar 1.0 -> 3.0: matrix.yaml asks bar>=3"]


def test_a_relock_after_an_inputs_change_moves_only_what_the_change_forces(project, indexes, tmp_path, monkeypatch):
    """The common lock and cpu's are written; the index gains newer cmn, dep and accelerate; a common
    package is added, which needs the newer dep: the common relock moves dep alone (one line, why) and
    keeps cmn; cpu's lock, stale through its inputs (the common pins are among them), keeps accelerate."""
    vendor, _default = indexes
    _cpu_index(project, tmp_path, vendor, monkeypatch)
    _wheel(tmp_path / "default" / "simple", "cmn", "1.0", requires=("dep",))
    _wheel(tmp_path / "default" / "simple", "dep", "1.0")
    said: list[str] = []

    def lock_both(common_packages: list[str]) -> tuple[dict[str, str], dict[str, str]]:
        edit_matrix(project, common_packages=common_packages)
        proj = load_project(project / "matrix.yaml")
        common = locks.common_lock(proj, "linux/amd64", say=said.append)
        return {p.name: p.version for p in common}, _lock(project, "cpu", said, common)

    assert lock_both(["cmn"]) == ({"cmn": "1.0", "dep": "1.0"},
                                  {"torch": "2.13.0+cpu", "foo": "1.0", "accelerate": "1.0"})
    _index_moves_on(tmp_path, monkeypatch, ("default", "cmn", "1.1", ("dep",)), ("default", "dep", "1.1", ()),
                    ("default", "accelerate", "1.1", ("torch",)), ("default", "extra", "1.0", ("dep>=1.1",)))
    assert lock_both(["cmn", "extra"]) == ({"cmn": "1.0", "dep": "1.1", "extra": "1.0"},
                                           {"torch": "2.13.0+cpu", "foo": "1.0", "accelerate": "1.0"})
    assert said == ["images/common.amd64.lock: dep 1.0 -> 1.1: extra 1.0 needs dep>=1.1"]


def test_without_the_vendor_index_the_default_one_serves(project, indexes):
    """The control: the default index's foo==99 is there, so the first test would see it if it leaked."""
    proj = load_project(project / "matrix.yaml")
    (foo,) = resolve.resolve(proj, ["foo"], "linux/amd64")
    assert foo.version == "99"


def test_the_host_pip_sources_are_read_from_its_configuration(monkeypatch):
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "https://mirror.example/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://a.example/simple https://b.example/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "/nonexistent/wheels")
    sources = resolve.pip_sources()
    assert sources.index_url == "https://mirror.example/simple"
    assert sources.extra_index_urls == ("https://a.example/simple", "https://b.example/simple")
    config = resolve.uv_config(sources, "https://vendor.example/whl")
    assert config.index("vendor.example") < config.index("a.example") < config.index("mirror.example")
    assert 'index-strategy = "first-index"' in config and "/nonexistent" not in config
    assert resolve.public("https://u:secret@vendor.example/whl") == "https://vendor.example/whl"


class _PathIndex(BaseHTTPRequestHandler):
    """A PEP 691 (JSON) index whose one file's URL decodes to a path, not a wheel's name: ``foo 1.0`` is
    ``foo-1.0-py3-none-any.whl`` by its ``filename``, but its ``url`` ends in ``..%2F..%2F..%2Fvictim.txt``
    (uv copies that URL into its pylock); any URL under ``/files/`` serves the wheel."""

    wheel = b""

    def do_HEAD(self) -> None:  # uv asks for range support first
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        if self.path.rstrip("/") == "/simple/foo":
            data = json.dumps({"meta": {"api-version": "1.0"}, "name": "foo", "files": [
                {"filename": "foo-1.0-py3-none-any.whl", "url": "/files/..%2F..%2F..%2Fvictim.txt",
                 "hashes": {"sha256": hashlib.sha256(self.wheel).hexdigest()}}]}).encode()
            kind = "application/vnd.pypi.simple.v1+json"
        elif self.path.startswith("/files/"):
            data, kind = self.wheel, "application/octet-stream"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, *_args: object) -> None:
        pass


def test_an_index_serving_a_path_for_a_file_name_is_refused_and_nothing_outside_is_touched(
        project, indexes, tmp_path, monkeypatch):
    """The index's URL of a wheel names the wheelhouse file, after percent-decoding: one that decodes to
    ``../../../victim.txt`` made the builder take a file three folders above the wheelhouse for the wheel,
    find its hash wrong, and delete it. It is bad input: one line naming the index, nothing written."""
    _wheel(tmp_path / "built", "foo", "1.0")
    handler = type("Handler", (_PathIndex,), {"wheel": (tmp_path / "built" / "foo" / "foo-1.0-py3-none-any.whl")
                                                        .read_bytes()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    house = tmp_path / "a" / "b" / "c" / "house"
    house.mkdir(parents=True)
    monkeypatch.setenv("BUILDER_WHEELHOUSE", str(house))
    victim = tmp_path / "a" / "victim.txt"  # house/../../../victim.txt
    victim.write_text("not the builder's\n")
    index = f"http://127.0.0.1:{server.server_address[1]}/simple"
    try:
        with pytest.raises(UserError) as raised:
            resolve.resolve(load_project(project / "matrix.yaml"), ["foo"], "linux/amd64", vendor_index=index)
    finally:
        server.shutdown()
        server.server_close()
    (line,) = raised.value.lines
    assert f"the index {index} serves foo 1.0 as" in line and "'../../../victim.txt' is not a wheel file name" in line
    assert victim.read_text() == "not the builder's\n"
    assert not [p for p in house.rglob("*") if not p.name.startswith(".")], "nothing fetched into the wheelhouse"
