"""``builder verify --rebuild``'s parts that need no engine: what it reads from a provenance, where it
checks the commit out, how it names a layer's first difference. The rebuild itself, on two real
engines: tests/engine/test_verify_rebuild.py."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from builder.config.errors import UserError
from builder.config.project import load_project
from builder.supply import layerdiff, provenance, rebuild
from devtools.support import REPO

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True,
                          env=GIT_ENV).stdout.strip()


def test_the_recorded_inputs_are_those_of_this_checkout():
    project = load_project(REPO / "matrix.yaml")
    cpu = project.target("cpu").default_view
    st = provenance.statement(project, cpu, f"localhost:5000/ml-runtime@sha256:{'ab' * 32}", None)
    recorded = rebuild.Recorded.of(st)
    assert (recorded.target, recorded.platform) == ("cpu", cpu.platform)
    assert recorded.commit == git("rev-parse", "HEAD", cwd=REPO)
    assert "images/cpu/Dockerfile" in recorded.files and "images/common.amd64.lock" in recorded.files
    rebuild.check_inputs(REPO, recorded)  # the files hold the digests the provenance records


def test_a_file_that_is_not_the_recorded_one_is_named(tmp_path):
    project = load_project(REPO / "matrix.yaml")
    recorded = rebuild.Recorded.of(provenance.statement(project, project.target("cpu").default_view,
                                                        f"r/x@sha256:{'ab' * 32}", None))
    copy = tmp_path / "images" / "cpu"
    copy.mkdir(parents=True)
    for rel in recorded.files:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    (tmp_path / "images/cpu/Dockerfile").write_text("FROM scratch\n")
    with pytest.raises(UserError, match=r"^images/cpu/Dockerfile at \w{12}: sha256 \w{12}, the provenance records"):
        rebuild.check_inputs(tmp_path, recorded)


def test_a_provenance_without_a_commit_cannot_be_rebuilt_from():
    st = {"predicate": {"buildDefinition": {"externalParameters": {"target": "cpu", "platform": "linux/amd64"},
                                            "resolvedDependencies": [{"name": "source",
                                                                      "digest": {"gitCommit": "unknown"}}]}}}
    with pytest.raises(UserError, match="names no target, platform or commit"):
        rebuild.Recorded.of(st)


@pytest.fixture
def repo(tmp_path) -> tuple[Path, str, str]:
    """A repository with two commits: (folder, the first, the second = HEAD)."""
    root = tmp_path / "repo"
    root.mkdir()
    git("init", "-q", "-b", "main", cwd=root)
    (root / "f").write_text("one\n")
    git("add", "f", cwd=root)
    git("commit", "-qm", "one", cwd=root)
    first = git("rev-parse", "HEAD", cwd=root)
    (root / "f").write_text("two\n")
    git("commit", "-qam", "two", cwd=root)
    return root, first, git("rev-parse", "HEAD", cwd=root)


def test_head_is_the_commit_so_the_checkout_itself_is_rebuilt(repo):
    root, _, head = repo
    said: list[str] = []
    (root / "f").write_text("changed\n")
    with rebuild.source(root / ".", head, said.append) as folder:
        assert folder == root
    assert "uncommitted changes are in the rebuild" in said[0]


def test_another_commit_is_checked_out_into_a_clone_that_goes_afterwards(repo):
    root, first, _ = repo
    with rebuild.source(root, first, lambda _: None) as folder:
        assert folder != root and (folder / "f").read_text() == "one\n"
    assert not folder.exists()
    assert (root / "f").read_text() == "two\n"


def test_a_commit_the_checkout_lacks_says_to_fetch_it(repo):
    root, _, _ = repo
    with pytest.raises(UserError, match=r"commit 0123456789ab is not in .*: git fetch"), \
            rebuild.source(root, "0123456789ab" * 3 + "0123", lambda _: None):
        pass


def _layer(files: dict[str, tuple[bytes, int]], order: list[str] | None = None, fmt: int = tarfile.GNU_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name in order or list(files):
            data, mtime = files[name]
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), mtime
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _entries(blob: bytes, tmp: Path, compress: str = "") -> dict[str, layerdiff.Entry]:
    path = tmp / f"layer{compress}"
    if compress == "gz":
        blob = gzip.compress(blob)
    if compress == "zst":
        blob = subprocess.run(["zstd", "-q", "-c"], input=blob, capture_output=True, check=True).stdout
    path.write_bytes(blob)
    return layerdiff.entries(path)


@pytest.mark.skipif(shutil.which("zstd") is None, reason="zstd is not installed (make host installs it)")
def test_the_same_files_in_other_formats_and_compressions_do_not_differ(tmp_path):
    files = {"opt/a.py": (b"a", 5), "opt/b.py": (b"b", 5)}
    gnu = _entries(_layer(files), tmp_path, "zst")
    pax = _entries(_layer(files, fmt=tarfile.PAX_FORMAT), tmp_path, "gz")
    assert layerdiff.first_difference(gnu, pax) is None


def test_the_first_difference_names_the_path_and_what_differs(tmp_path):
    files = {"opt/a.py": (b"a", 5), "opt/b.py": (b"b", 5)}
    published = _entries(_layer(files), tmp_path)
    assert layerdiff.first_difference(published, _entries(_layer({**files, "opt/b.py": (b"b", 6)}), tmp_path)) \
        == ("opt/b.py", "mtime")
    assert layerdiff.first_difference(published, _entries(_layer({"opt/a.py": (b"a", 5)}), tmp_path)) \
        == ("opt/b.py", "only in the published layer")
    assert layerdiff.first_difference(published, _entries(_layer({**files, "opt/c": (b"", 5)}), tmp_path)) \
        == ("opt/c", "only in the rebuilt layer")
    assert layerdiff.first_difference(published, _entries(_layer(files, ["opt/b.py", "opt/a.py"]), tmp_path)) \
        == ("opt/a.py", "the same members in another order")
