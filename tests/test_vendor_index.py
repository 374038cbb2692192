"""Dependency confusion: a name the vendor index has never comes from the default index.

Two PEP 503 indexes on loopback, with tiny wheels built here: the vendor's ``foo==1.0``, the
default's ``foo==99`` (and ``bar``, which only the default has).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import threading
import zipfile
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from builder.config.project import load_project
from builder.images import lockfile, locks, resolve, wheelhouse
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


def _serve(folder: Path) -> Iterator[str]:
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


def test_a_target_added_later_keeps_its_siblings_pins_unless_its_packages_need_others(
        project, indexes, tmp_path, monkeypatch):
    """The index moves on between two locks (foo 2.0 appears after cpu was locked): a target added
    later, cpu plus a package, still gets cpu's foo 1.0, so it shares cpu's torch layers; one whose own
    package needs foo>=2 gets foo 2.0 (the siblings' pins are a preference, not a cap)."""
    vendor, _default = indexes
    _wheel(tmp_path / "vendor" / "simple", "torch", "2.13.0+cpu", requires=("foo",))
    _wheel(tmp_path / "default" / "simple", "accelerate", "1.0", requires=("torch",))  # matrix.yaml's torch_packages
    monkeypatch.setenv("BUILDER_INDEX_CPU", vendor)  # cpu's torch index (download.pytorch.org) is this one here
    doc = yaml.safe_load((project / "matrix.yaml").read_text())
    cpu = next(t for t in doc["targets"] if t["name"] == "cpu")
    edit_matrix(project, targets=[*doc["targets"], {**cpu, "name": "cpu-hf", "packages": ["bar"]},
                                  {**cpu, "name": "cpu-new", "packages": ["foonext"]}])
    proj = load_project(project / "matrix.yaml")

    def versions(name: str) -> dict[str, str]:
        return {p.name: p.version for p in locks.target_lock(proj, proj.target(name).on("linux/amd64"), [])}

    assert versions("cpu") == {"torch": "2.13.0+cpu", "foo": "1.0", "accelerate": "1.0"}
    _wheel(tmp_path / "vendor" / "simple", "foo", "2.0")  # the index moves on (foo comes from the vendor's: first-index)
    _wheel(tmp_path / "default" / "simple", "foonext", "1.0", requires=("foo>=2",))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache-later"))  # uv sees the new pages (no cached ones)
    assert versions("cpu-hf") == {"torch": "2.13.0+cpu", "foo": "1.0", "accelerate": "1.0",
                                 "bar": "2.0"}
    assert versions("cpu-new") == {"torch": "2.13.0+cpu", "foo": "2.0", "accelerate": "1.0",
                                  "foonext": "1.0"}


def test_a_relock_for_an_added_package_keeps_the_targets_own_pins(project, indexes, tmp_path, monkeypatch):
    """cpu is locked with foo 1.0; the index moves on (foo 2.0); then cpu gets a package: the relock
    keeps foo 1.0 from cpu's own lock (no sibling shares cpu's torch here), so only the packages
    layer changes. A requirement the target states itself wins over its old pin (bar 1.0 -> 2.0)."""
    vendor, _default = indexes
    _wheel(tmp_path / "vendor" / "simple", "torch", "2.13.0+cpu", requires=("foo",))
    _wheel(tmp_path / "default" / "simple", "accelerate", "1.0", requires=("torch",))
    _wheel(tmp_path / "default" / "simple", "bar", "1.0")
    monkeypatch.setenv("BUILDER_INDEX_CPU", vendor)
    doc = yaml.safe_load((project / "matrix.yaml").read_text())

    def versions(packages: list[str]) -> dict[str, str]:
        for t in doc["targets"]:
            if t["name"] == "cpu":
                t["packages"] = packages
        edit_matrix(project, targets=doc["targets"])
        proj = load_project(project / "matrix.yaml")
        cpu = proj.target("cpu").on("linux/amd64")
        assert not locks.sibling_pins(proj, cpu, []), "the test needs cpu without siblings"
        return {p.name: p.version for p in locks.target_lock(proj, cpu, [])}

    assert versions(["bar==1.0"]) == {"torch": "2.13.0+cpu", "foo": "1.0", "accelerate": "1.0", "bar": "1.0"}
    _wheel(tmp_path / "vendor" / "simple", "foo", "2.0")
    _wheel(tmp_path / "default" / "simple", "baz", "1.0")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache-later"))
    assert versions(["bar", "baz"]) == {"torch": "2.13.0+cpu", "foo": "1.0", "accelerate": "1.0",
                                        "bar": "2.0", "baz": "1.0"}


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
