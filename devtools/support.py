"""Support shared by the tests and the benchmark: project copies, ports, registries, base pins.

One definition each of: a private copy of the project (:func:`copy_project`), a free loopback
port (:func:`free_port`), a matrix edit (:func:`edit_matrix`) and its registry
(:func:`registry_of`), the base pin moved to another registry (:func:`retarget_base_lock`), a
private ``docker-registry`` (:func:`start_registry`, :func:`stop`) with a login
(:func:`registry_login`) that a Docker config of the tests' own holds (:func:`docker_config`,
:func:`docker_login`, :func:`auth_header`), and the rule for a missing prerequisite in a test
(:func:`fail_or_skip`: fail under CI, skip elsewhere).

Example:
    >>> import tempfile
    >>> root = copy_project(Path(tempfile.mkdtemp()) / "project")
    >>> edit_matrix(root, registry=f"127.0.0.1:{free_port()}/ml-runtime")["registry"].startswith("127.0.0.1:")
    True
"""

from __future__ import annotations

import base64
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NoReturn

import yaml

REPO = Path(__file__).resolve().parent.parent
PROJECT_FILES = ["matrix.yaml", "wheel-mapping.json", "base.lock.json", ".dockerignore", ".hadolint.yaml"]
PROJECT_DIRS = ["templates", "runtime", "examples", "images", "scripts"]


def copy_project(dest: Path) -> Path:
    """A private copy of the project: what a build reads, nothing else.

    Example:
        >>> import tempfile
        >>> copy_project(Path(tempfile.mkdtemp()) / "project").joinpath("matrix.yaml").is_file()
        True
    """
    dest.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        if (REPO / name).exists():
            shutil.copy2(REPO / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in PROJECT_DIRS:
        shutil.copytree(REPO / name, dest / name, ignore=ignore)
    return dest


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def edit_matrix(root: Path, **changes: object) -> dict[str, Any]:
    """Rewrite keys of root/matrix.yaml; return the new document."""
    path = root / "matrix.yaml"
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    doc.update(changes)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return doc


def native_only(root: Path) -> dict[str, Any]:
    """Make every target of root/matrix.yaml build for this host's platform only (the tests build
    the native platform, and the emulated one only where a test says it needs it)."""
    doc: dict[str, Any] = yaml.safe_load((root / "matrix.yaml").read_text())
    for target in doc["targets"]:
        target.pop("platforms", None)
    return edit_matrix(root, platforms=[host_platform()], targets=doc["targets"])


def registry_of(root: Path) -> str:
    """The ``registry`` of root/matrix.yaml (``host:port/repository``)."""
    registry: str = yaml.safe_load((root / "matrix.yaml").read_text())["registry"]
    return registry


def engine_refs_under(prefix: str) -> list[str]:
    """Every name the local engine gives an image under *prefix* (a repository, or a registry's
    ``host:port``): its tags and its names by digest. ``docker images`` prints one name per image on
    the containerd store, so a name by digest alone (a base pinned in a test's registry) is read from
    each image's ``RepoDigests``."""
    ids = subprocess.run(["docker", "images", "--all", "--quiet", "--no-trunc"],
                         capture_output=True, text=True, check=False).stdout.split()
    if not ids:
        return []
    listed = subprocess.run(["docker", "image", "inspect", "--format", "{{json .RepoTags}}\t{{json .RepoDigests}}",
                             *dict.fromkeys(ids)], capture_output=True, text=True, check=False).stdout
    names = [n for line in listed.splitlines() for part in line.split("\t") for n in json.loads(part) or []]
    return [n for n in dict.fromkeys(names) if n[len(prefix):len(prefix) + 1] in ("/", ":", "@")
            and n.startswith(prefix)]


def host_platform() -> str:
    """This host's OCI platform, as base.lock.json keys it (devtools imports nothing of builder)."""
    return {"x86_64": "linux/amd64", "aarch64": "linux/arm64"}.get(platform.machine(), platform.machine())


def base_pin(root: Path, on: str | None = None) -> dict[str, Any]:
    """One platform's entry of root/base.lock.json (default: this host's): reference, image_id, packages."""
    lock: dict[str, Any] = json.loads((root / "base.lock.json").read_text())
    return dict(lock["platforms"][on or host_platform()])


def retarget_base_lock(src: Path, dest: Path, registry: str, digest: str | None = None) -> dict[str, Any]:
    """Write dest/base.lock.json: src's base pins (and dest's own for the platforms src lacks),
    referenced as ``<registry>/base@<digest>``.

    The base image is the same (same layers, same config), so pushed to another registry it keeps
    its digest: *digest* (this host's platform) defaults to the one src pins. Returns this host's
    platform's new pin (reference, image_id, packages).
    """
    lock: dict[str, Any] = json.loads((src / "base.lock.json").read_text())
    if (dest / "base.lock.json").exists():  # the platforms src does not pin keep dest's own pins
        kept = json.loads((dest / "base.lock.json").read_text())
        if kept.get("spec_sha256") == lock["spec_sha256"]:
            lock["platforms"] = {**kept.get("platforms", {}), **lock["platforms"]}
    host = host_platform()
    for name, pinned in lock["platforms"].items():
        own = digest if digest and name == host else pinned["reference"].split("@", 1)[1]
        pinned["reference"] = f"{registry}/base@{own}"
    (dest / "base.lock.json").write_text(json.dumps(lock))
    return dict(lock["platforms"][host])


def fail_or_skip(reason: str) -> NoReturn:
    """A test's prerequisite is missing: fail when CI is set (a silent skip would hide it), else skip."""
    import pytest

    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {reason}")
    pytest.skip(reason)


def wait_http(url: str, timeout: float = 15) -> None:
    """Wait until *url* answers (any HTTP status counts: 401 is up and wants credentials)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def start_registry(folder: Path, htpasswd: Path | None = None,
                   delete: bool = False) -> tuple[str, subprocess.Popen[bytes]]:
    """Start Debian's docker-registry on a free loopback port; return (host:port, process).

    ``delete`` lets clients delete manifests (a test removes an attachment). Raises
    FileNotFoundError when docker-registry is not installed.
    """
    binary = shutil.which("docker-registry")
    if binary is None:
        raise FileNotFoundError("docker-registry is not installed (apt-get install docker-registry)")
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    auth = f"auth:\n  htpasswd:\n    realm: test\n    path: {htpasswd}\n" if htpasswd else ""
    (folder / "config.yml").write_text(
        f"version: 0.1\nlog: {{level: error}}\nstorage:\n  filesystem: {{rootdirectory: {folder / 'data'}}}\n"
        f"  delete: {{enabled: {'true' if delete else 'false'}}}\n"
        f"http: {{addr: '127.0.0.1:{port}'}}\n{auth}"
    )
    with open(folder / "log", "wb") as log:
        env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}  # it reads them as its config
        proc = subprocess.Popen([binary, "serve", str(folder / "config.yml")], stdout=subprocess.DEVNULL, stderr=log,
                                env=env)
    wait_http(f"http://127.0.0.1:{port}/v2/")
    return f"127.0.0.1:{port}", proc


def registry_login(folder: Path) -> tuple[str, str, Path]:
    """A login for a test registry: (user, a random password, an htpasswd file in *folder* holding its
    bcrypt hash, for :func:`start_registry`)."""
    import secrets

    import bcrypt

    user, password = "ci-user", secrets.token_urlsafe(16)
    folder.mkdir(parents=True, exist_ok=True)
    htpasswd = folder / "htpasswd"
    htpasswd.write_text(f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()}\n")
    return user, password, htpasswd


def docker_config(folder: Path) -> Path:
    """A Docker config folder of the tests' own: the user's ``config.json`` (``$DOCKER_CONFIG`` or
    ``~/.docker``) copied, its ``buildx``, ``contexts`` and ``cli-plugins`` linked, so that a
    :func:`docker_login` never writes into the user's own."""
    source = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker")
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads((source / "config.json").read_text()) if (source / "config.json").is_file() else {}
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("buildx", "contexts", "cli-plugins"):
        if (source / name).is_dir() and not (folder / name).exists():
            (folder / name).symlink_to(source / name)
    return folder


def docker_login(config: Path, host: str, user: str, password: str) -> None:
    """What ``docker login host`` writes, into the config folder *config* (:func:`docker_config`)."""
    path = config / "config.json"
    doc = json.loads(path.read_text()) if path.is_file() else {}
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    doc.setdefault("auths", {})[host] = {"auth": token}
    path.write_text(json.dumps(doc))
    path.chmod(0o600)


def auth_header(host: str) -> dict[str, str]:
    """The Authorization header ``$DOCKER_CONFIG``'s login for *host* gives ({} without one): for a
    test's own requests to a registry that takes no request without a login."""
    path = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "config.json"
    try:
        token = json.loads(path.read_text())["auths"][host]["auth"]
    except (OSError, ValueError, KeyError):
        return {}
    return {"Authorization": f"Basic {token}"}


def stop(proc: subprocess.Popen[bytes], timeout: float = 10) -> None:
    """SIGTERM, then SIGKILL after *timeout* seconds."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def registry_manifest(ref: str) -> dict[str, Any]:
    """The image manifest under *ref* (``host:port/name:tag`` or ``@digest``, a plain-HTTP registry), read from the
    registry itself."""
    import urllib.request

    repository, tag = ref.split("@", 1) if "@" in ref else ref.rsplit(":", 1)
    host, name = repository.split("/", 1)
    accept = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
    request = urllib.request.Request(f"http://{host}/v2/{name}/manifests/{tag}",
                                     headers={"Accept": accept, **auth_header(host)})
    with urllib.request.urlopen(request, timeout=60) as response:
        manifest: dict[str, Any] = json.loads(response.read())
        return manifest


def registry_layers(ref: str) -> list[tuple[str, int]]:
    """(digest, compressed size) of each layer of the image manifest under *ref* (:func:`registry_manifest`)."""
    return [(layer["digest"], layer["size"]) for layer in registry_manifest(ref)["layers"]]


#: The first bytes of a zstd frame: a layer ``docker save`` writes as the engine holds it (zstd by default).
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def layer_tar(blob: bytes) -> bytes:
    """A layer blob as its tar: zstd through the ``zstd`` program (the standard library has none before
    Python 3.14); gzip and a plain tar are left to :mod:`tarfile`, which reads both."""
    if blob[:4] == ZSTD_MAGIC:
        return subprocess.run(["zstd", "-dc"], input=blob, capture_output=True, check=True).stdout
    return blob

