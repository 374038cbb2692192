"""podman as an :class:`~builder.oci.engine.Engine`: :class:`PodmanEngine`, through podman's Docker-compatible
API (a :class:`~builder.oci.docker.DockerAPI`) for what it answers as Docker does, and the podman CLI for what
it does not (builds with buildah, pushes, pulls from plain-http loopback registries, containers the API would
create otherwise); :data:`CREATE_FLAGS` is the table of its CLI's container options.

Example:
    >>> podman_lacks("4.3.1").items[0]
    'per-RUN --network (podman 4.5): the whole build runs with --network=none'
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import functools
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from builder.config.errors import UserError
from builder.oci import buildah, registry
from builder.oci.docker import ClientError, DockerAPI
from builder.oci.engine import (
    TIMEOUT_S,
    BuildRequest,
    BuildResult,
    CacheRecord,
    DiskUsage,
    EngineError,
    EngineFacts,
    ImageFacts,
    ImageUnknown,
    Lacks,
    PushFailed,
    engine_version,
)
from builder.oci.recompress import recompress
from builder.oci.runflags import RUN_FLAGS, cli_args
from builder.oci.secrets import PODMAN, child_env

#: The oldest podman builds are tested on (Debian 12's): ``--build-context``, ``RUN --mount=from=``.
MIN_PODMAN = (4, 3)


def connect_podman(timeout: int = TIMEOUT_S) -> PodmanEngine:
    """podman 4.3 or newer, its API at CONTAINER_HOST, its own socket, or a service of ours; else one UserError."""
    if shutil.which("podman") is None:
        raise UserError("podman is not installed: apt-get install podman buildah (or: make host ENGINE=podman)")
    try:
        engine = PodmanEngine.from_env(timeout)
        version = engine.version()
    except (ClientError, OSError, subprocess.SubprocessError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise UserError(f"podman's API does not answer ({reason}); check 'podman info', or start it: "
                        "podman system service --time=0 and point CONTAINER_HOST at it") from None
    if engine_version(version) < MIN_PODMAN:
        engine.close()
        raise UserError(f"podman {version} is too old; builder needs podman >= {'.'.join(map(str, MIN_PODMAN))} "
                        "(--build-context, RUN --mount=type=bind,from=): upgrade it")
    return engine


#: prctl(PR_SET_PDEATHSIG): the podman service we start ends with the process that started it.
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def podman_socket() -> str | None:
    """podman's API where one listens already: CONTAINER_HOST (podman's own variable), else the socket
    ``podman.socket`` (systemd) serves, root's or the user's; None when none is there."""
    if host := os.environ.get("CONTAINER_HOST"):
        return host
    runtime = "/run" if os.geteuid() == 0 else os.environ.get("XDG_RUNTIME_DIR", f"/run/user/{os.getuid()}")
    path = Path(runtime) / "podman" / "podman.sock"
    return f"unix://{path}" if path.is_socket() else None


#: The podman releases from which builds and pushes use what they lack before (see :func:`podman_lacks`).
PODMAN_PER_RUN_NETWORK, PODMAN_FORCE_COMPRESSION, PODMAN_LAYER_CACHE = (4, 5), (4, 7), (5, 0)


#: Where podman reads CDI specs (its containers.conf default): it always does, no setting turns it on.
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")


def podman_lacks(version: str) -> Lacks:
    """What podman *version* does not do that builds with docker do (``builder doctor`` lists it), and what would:
    BuildKit's registry cache (always last) no podman has.

    Example:
        >>> podman_lacks("4.3.1").items[0]
        'per-RUN --network (podman 4.5): the whole build runs with --network=none'
        >>> podman_lacks("5.4.2").fix
        'none in podman: a fresh runner builds what a BuildKit runner would take from its registry cache'
    """
    found = engine_version(version)
    lacks = []
    if found < PODMAN_PER_RUN_NETWORK:
        lacks.append("per-RUN --network (podman 4.5): the whole build runs with --network=none")
    if found < PODMAN_FORCE_COMPRESSION:
        lacks.append("push --force-compression (podman 4.7): a layer the registry holds in another compression "
                     "(the base's) is recompressed by builder after the push")
    if found < PODMAN_LAYER_CACHE:
        lacks.append("a layer cache that mounts cached stages (podman 5): a changed target builds whole (--no-cache)")
    lacks.append("BuildKit's registry cache (--cache-from/--cache-to type=registry): content tags still reuse images")
    if len(lacks) > 1:
        return Lacks(tuple(lacks), "podman >= 5 (Debian 13 has 5.4) has all but BuildKit's registry cache")
    return Lacks(tuple(lacks), "none in podman: a fresh runner builds what a BuildKit runner would take from its "
                 "registry cache")


class PodmanEngine:
    """:class:`~builder.oci.engine.Engine` over podman: a :class:`~builder.oci.docker.DockerAPI` on podman's
    Docker-compatible API (``podman system service``) for what that API answers as Docker does (inspect, tag,
    containers, save/load, df: those requests are written once, there), and the podman CLI for what it does
    not: builds (buildah, :mod:`builder.oci.buildah`), pushes (compression is chosen at push), pulls from
    plain-http loopback registries (``--tls-verify=false``) and the containers :meth:`create` says.

    Where no API listens (no systemd socket, no CONTAINER_HOST), it starts ``podman system service`` on
    a private socket for its own lifetime: stopped by :meth:`close`, at exit, or with this process.
    """

    def __init__(self, api: DockerAPI, url: str, service: subprocess.Popen[bytes] | None = None,
                 folder: str | None = None) -> None:
        self.api = api
        self.url, self.service, self.folder = url, service, folder
        self._graph_root: str | None = None  # store_key's, asked once
        #: {image ID: repo@digest pushed}: podman's RepoDigests name the local manifest only, never the one a
        #: push wrote (it compresses at push), so what its --digestfile said is kept here
        self.pushed: dict[str, set[str]] = {}
        if service is not None:
            atexit.register(self.close)

    @classmethod
    def from_env(cls, timeout: int = TIMEOUT_S) -> PodmanEngine:
        if (url := podman_socket()) is not None:
            return cls(DockerAPI.at(url, timeout), url)
        folder = tempfile.mkdtemp(prefix="builder-podman-api-")
        url = f"unix://{folder}/podman.sock"
        service = subprocess.Popen(["podman", "system", "service", "--time=0", url], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                                   env=child_env(PODMAN), preexec_fn=_die_with_parent)  # noqa: PLW1509 - prctl only, no locks taken
        deadline = time.monotonic() + 30
        while not Path(folder, "podman.sock").is_socket():
            if service.poll() is not None or time.monotonic() > deadline:
                error = (service.stderr.read().decode(errors="replace") if service.poll() is not None
                         and service.stderr else "no socket after 30 s").strip().splitlines() or ["?"]
                service.kill()
                service.wait()
                shutil.rmtree(folder, ignore_errors=True)
                raise OSError(f"podman system service: {error[-1][:200]}")
            time.sleep(0.1)
        return cls(DockerAPI.at(url, timeout), url, service, folder)

    def name(self) -> str:
        return "podman"

    def address(self) -> str:
        return self.url

    def store_key(self) -> str:
        # Its storage, not its socket: a builder that finds no podman API starts a service of its own on
        # a private socket, another one in every process, and each run's records were filed apart (a
        # later `builder gc` found none of them).
        if self._graph_root is None:
            store = self.api.get("/libpod/info").get("store") or {}
            self._graph_root = str(store.get("graphRoot") or self.url)
        return f"storage {self._graph_root}"

    def label(self) -> tuple[str, str]:
        return f"podman at {self.url}", "podman info"

    def version(self) -> str:
        return str(self.api.version().get("Version") or "")

    def info(self) -> EngineFacts:
        return self.api.facts(
            product="podman", store=self.store(), cdi_spec_dirs=CDI_DIRS, builds_with="podman build (buildah)",
            compresses_at_push=True, gpus_by_cdi_only=True,
            disk_fix="podman system prune, or move graphroot (storage.conf) to a larger disk")

    def lacks(self) -> Lacks:
        return podman_lacks(self.version())

    def store(self) -> str:
        # podman keeps layers uncompressed and compresses at push: no containerd image store that keeps
        # BuildKit's compression (its info names no containerd snapshotter)
        return "classic"

    def image(self, ref: str) -> ImageFacts | None:
        return self.api.image(ref)

    def resolve(self, names: Sequence[str]) -> str:
        for name in names:
            found = self.image(name)
            if found is not None:
                return found.id
        raise ImageUnknown(f"podman at {self.url} knows none of {', '.join(names)}, which buildah just built; "
                        "is its API the same user's storage as the podman CLI (CONTAINER_HOST)?")

    def tag(self, image: str, ref: str) -> None:
        self.api.tag(image, ref)

    def size(self, image: str) -> int:
        return self.api.size(image)

    def labels(self, image: str) -> dict[str, str]:
        return self.api.labels(image)

    def save(self, ref: str) -> Iterator[bytes]:
        return self.api.save(ref)

    def load(self, archive: Path | Iterable[bytes]) -> None:
        self.api.load(archive)

    def serves_image_contexts(self, builder: str | None) -> bool:
        return False  # buildah reads a folder context where it is: no copy of it per build to spare

    def remove_image(self, ref: str) -> str | None:
        return self.api.remove_image(ref)

    def attach(self, container: str) -> Iterator[tuple[bytes | None, bytes | None]]:
        return self.api.attach(container)

    def start(self, container: str) -> None:
        self.api.start(container)

    def wait(self, container: str) -> int:
        return self.api.wait(container)

    def stop(self, container: str, timeout: int) -> None:
        self.api.stop(container, timeout)

    def containers(self, label: str) -> list[str]:
        return self.api.containers(label)

    def container_labels(self, label: str) -> dict[str, dict[str, str]]:
        return self.api.container_labels(label)

    def remove_container(self, container: str) -> None:
        self.api.remove_container(container)

    def run(self, image: str, command: Sequence[str], *, labels: Mapping[str, str], timeout: int,
            **options: Any) -> tuple[int, str, str]:
        created = self.create({"image": image, "command": list(command), "labels": dict(labels), **options})
        return self.api.run_created(created, timeout)

    def create(self, options: Mapping[str, Any]) -> str:
        """A container of docker-py *options*: by the compatible API where it does what Docker does, else by
        the CLI (the API attaches, starts and waits as for any). The CLI where the API would do otherwise:

        - a CDI device: the API drops a device request of driver "cdi" without a word (4.3.1: the container
          starts without the device), and a CDI name as a device path fails its stat; the CLI reads specs;
        - a variable to unset (a bare name in a list ``environment``, as Docker's API takes it): the API
          keeps the image's value (the emulated smoke test's TINI_SUBREAPER, fatal under qemu); the CLI
          has ``--unsetenv``;
        - rootless, the user's own UID as ``user`` (``builder run``): it is the same inside only with
          ``--userns keep-id``, which docker-py refuses to send; else it is a subordinate ID and
          /workspace, the user's, is not writable.

        A GPU request other than a CDI name (docker's ``--gpus``) is refused on either path: the API takes it and
        starts the container without the GPUs (4.3.1, tried), the CLI has no form for it.
        """
        _podman_gpus(options.get("device_requests") or [])
        environment = options.get("environment")
        unset = isinstance(environment, list) and any("=" not in entry for entry in environment)
        own = own_user(options) and self.rootless()
        if not (_cdi_names(options) or unset or own):
            return self.api.create(_api_options(options))
        argv = [*(["--userns", "keep-id"] if own else []), *_create_argv(options)]
        return self._cli(["create", *argv], "podman create").stdout.strip().splitlines()[-1]

    @functools.cache  # noqa: B019 - one engine a run, and its release does not change under it
    def release(self) -> tuple[int, int]:
        """This podman's (major, minor), asked once: builds and pushes branch on it."""
        return engine_version(self.version())

    def forces_compression(self) -> bool:
        """Whether this podman's push takes ``--force-compression`` (4.7): every layer in the asked one."""
        return self.release() >= PODMAN_FORCE_COMPRESSION

    @functools.cache  # noqa: B019 - one engine a run; its mode does not change under it
    def rootless(self) -> bool:
        """Whether this podman runs without root (user namespaces, subuid/subgid), asked once."""
        # podman's own info (the libpod API beside the compatible one): the compatible info does not say it
        return bool(self.api.get("/libpod/info").get("host", {}).get("security", {}).get("rootless"))

    def _cli(self, argv: list[str], what: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["podman", *argv], capture_output=True, text=True, check=False, env=child_env(PODMAN))
        if proc.returncode != 0:
            raise EngineError(f"{what}: {(proc.stderr.strip().splitlines() or ['?'])[-1][:300]}")
        return proc

    def pull(self, ref: str, creds: dict[str, str] | None = None, *, platform: str | None = None) -> None:
        host = registry.Ref.parse(ref).host
        with registry.authfile(host, creds) as authfile:
            self._cli(["pull", "--quiet", *(["--platform", platform] if platform else []),
                       *(["--authfile", authfile] if authfile else []), *_tls(host), ref], f"pull of {ref}")

    def push(self, ref: str, compression: str = "gzip") -> str:
        r = registry.Ref.parse(ref)
        creds = registry.credentials(r.host)
        with tempfile.TemporaryDirectory(prefix="builder-push-") as tmp, registry.authfile(r.host, creds) as authfile:
            digestfile = Path(tmp) / "digest"
            # zstd needs OCI media types (Docker's has no zstd type); gzip keeps Docker's, as buildx's exporter
            manifest = "oci" if compression == "zstd" else "v2s2"
            proc = subprocess.run(
                ["podman", "push", "--quiet", "--format", manifest, "--compression-format", compression,
                 *(["--force-compression"] if self.forces_compression() else []), "--digestfile", str(digestfile), *(["--authfile", authfile] if authfile else []), *_tls(r.host), ref],
                capture_output=True, text=True, check=False, env=child_env(PODMAN))
            if proc.returncode != 0:
                raise PushFailed(registry.push_refused(r.host, proc.stderr.strip().splitlines()[-1] if proc.stderr.strip()
                                          else f"podman push exited {proc.returncode}", "podman login"))
            digest = digestfile.read_text().strip() if digestfile.exists() else None
        reported = registry.manifest_digest(ref, creds)
        if digest is None or reported != digest:
            raise PushFailed(f"push of {ref}: registry reports {reported}, podman pushed {digest}")
        # podman < 4.7 has no --force-compression: a layer the registry holds already (the base's, pushed as
        # gzip) is reused in its compression. A mixed image breaks enroot 4.0-4.1.2 (the first layer's type
        # applies to all) and a zstd layer every puller before Docker 23: recompress those layers here.
        digest = recompress(ref, compression, creds) or digest
        if (found := self.image(ref)) is not None:
            self.pushed.setdefault(found.id, set()).add(f"{r.name}@{digest}")
        return digest

    def repo_digests(self, ref: str) -> list[str]:
        found = self.image(ref)
        if found is None:
            return []
        return sorted({*found.digests, *self.pushed.get(found.id, ())})

    def disk_usage(self) -> DiskUsage:
        usage = self.api.disk_usage()
        # podman 4.3's compatible df lists an image once per tag, by the tag alone and without labels; its
        # images list names them as Docker's df does: that, with df's sizes and container counts
        found = {i.id.removeprefix("sha256:"): i for i in usage.images}
        images = []
        for image in self.api.images():
            sizes = found.get(image.id.removeprefix("sha256:"), ImageFacts(image.id))
            images.append(dataclasses.replace(image, size=sizes.size, shared_size=sizes.shared_size,
                                              containers=sizes.containers))
        return DiskUsage(tuple(images), usage.build_cache)

    def build_cache(self) -> list[CacheRecord]:
        return []  # buildah's cache is its images (see prune_build_cache)

    def prune_build_cache(self, record: str) -> str | None:
        return "podman keeps no build cache apart from its images (builder gc removes those)"

    def build(
        self,
        request: BuildRequest,
        *,
        on_step: Callable[[int, int, str], None] = lambda n, total, text: None,
        on_log: Callable[[str], None] = lambda line: None,
        cancel: threading.Event | None = None,
        registry_host: str | None = None,
        cwd: Path | None = None,
    ) -> tuple[str, BuildResult]:
        """buildah pulls the base from *registry_host* itself (when it is not local), with the same credentials."""
        creds = registry.credentials(registry_host) if registry_host else None
        per_run_network = self.release() >= PODMAN_PER_RUN_NETWORK
        if self.release() < PODMAN_LAYER_CACHE and not request.no_cache:
            # buildah 1.28 (podman 4.3) mounts nothing for `RUN --mount=from=<stage>` when that stage came
            # whole from its layer cache ("couldn't find .../merged/opt/uv on host to bind mount"): the
            # second build of a changed target failed. Build without the cache there; an unchanged target
            # is still a no-op (its content tag). podman 5.4.2 (buildah 1.39.3) builds a changed target with the
            # cache on (run in a Debian 13 container); between 4.3 and 5.4 is untried, so 5.0 is the cut.
            request = dataclasses.replace(request, no_cache=True)
        with registry.authfile(registry_host, creds) as authfile:
            result = buildah.run(request, per_run_network=per_run_network, on_step=on_step, on_log=on_log,
                                 cancel=cancel, authfile=authfile, tls_verify=not (registry_host and registry.is_local(registry_host)),
                                 cwd=cwd)
        return self.resolve(result.ids), result

    def close(self) -> None:
        self.api.close()
        service, self.service = self.service, None
        if service is not None:
            service.terminate()
            try:
                service.wait(timeout=10)
            except subprocess.TimeoutExpired:
                service.kill()
                service.wait()
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)


def _api_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """docker-py container *options* as podman's compatible API must get them to do what Docker does.

    - A tmpfs is empty, as Docker mounts one: podman copies what is at the path onto its tmpfs
      (``tmpcopyup``, its default), and a copy of sysfs fails (``tmpcopyup: failed to copy
      /sys/devices/system/cpu``: the smoke test's mask under emulation). ``notmpcopyup`` unless asked.
    - No network named: podman's own default for its mode (``private``: rootful a bridge, rootless
      slirp4netns, pasta from podman 5), as its CLI does. The API would take Docker's ``bridge``, which a
      rootless podman 4.3 cannot set up without a rootless network namespace (``failed to mount runtime
      directory for rootless netns``), so ``builder run`` did not start rootless.

    Example:
        >>> _api_options({"tmpfs": {"/sys/devices/system/cpu": "ro", "/a": ""}, "user": "1001"})
        {'tmpfs': {'/sys/devices/system/cpu': 'ro,notmpcopyup', '/a': 'notmpcopyup'}, 'user': '1001', 'network_mode': 'private'}
        >>> _api_options({"network_mode": "none"})
        {'network_mode': 'none'}
    """
    out = {**options, "network_mode": options.get("network_mode") or "private"}
    if tmpfs := options.get("tmpfs"):
        out["tmpfs"] = _empty_tmpfs(tmpfs)
    return out


def _empty_tmpfs(tmpfs: Mapping[str, str]) -> dict[str, str]:
    """Each tmpfs's options with ``notmpcopyup`` (see :func:`_api_options`), unless they say otherwise."""
    return {path: how if "tmpcopyup" in how else ",".join(filter(None, [how, "notmpcopyup"]))
            for path, how in tmpfs.items()}


def _cdi_names(options: Mapping[str, Any]) -> list[str]:
    """The CDI device names among docker-py *options*' device requests (driver ``cdi``)."""
    return [name for request in options.get("device_requests") or [] if request.get("Driver") == "cdi"
            for name in request.get("DeviceIDs") or []]


def own_user(options: Mapping[str, Any]) -> bool:
    """Whether the container runs as this process's UID:GID (``builder run --user auto``): rootless podman keeps it
    the same inside only with ``--userns keep-id``."""
    return str(options.get("user") or "") == f"{os.getuid()}:{os.getgid()}"


def _podman_gpus(requests: Sequence[Mapping[str, Any]]) -> list[str]:
    """CDI requests as ``--device`` names; any other (docker's ``--gpus``: a no-op before podman 5) has no podman
    form."""
    if any(request.get("Driver") != "cdi" for request in requests):
        raise EngineError("podman names GPUs by CDI only: a device request other than a CDI name (docker's "
                          "--gpus) has no podman form; make a CDI spec: nvidia-ctk cdi generate "
                          "--output=/var/run/cdi/nvidia.yaml")
    return [arg for name in _cdi_names({"device_requests": requests}) for arg in ("--device", name)]


#: docker-py ``containers.create`` options (those builder gives) as ``podman create``/``podman run`` arguments:
#: Docker's (:data:`builder.oci.runflags.RUN_FLAGS`) but a variable to unset, a tmpfs empty as Docker mounts one
#: (podman copies what is at the path), and GPUs by CDI name only.
CREATE_FLAGS: dict[str, Callable[[Any], list[str]]] = {
    **RUN_FLAGS,
    "environment": lambda value: [a for entry in (value if isinstance(value, list) else
                                                  [f"{k}={v}" for k, v in value.items()])
                                  for a in (("--env", entry) if "=" in entry else ("--unsetenv", entry))],
    "tmpfs": lambda value: [a for path, how in _empty_tmpfs(value).items() for a in ("--tmpfs", f"{path}:{how}")],
    "device_requests": _podman_gpus,
}


def _create_argv(options: Mapping[str, Any]) -> list[str]:
    """``podman create`` arguments for docker-py ``containers.create`` *options*.

    Example:
        >>> _create_argv({"image": "i", "command": ["ls"], "environment": {"A": "1"}, "working_dir": "/w",
        ...               "device_requests": [{"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=all"]}]})
        ['--env', 'A=1', '--workdir', '/w', '--device', 'nvidia.com/gpu=all', 'i', 'ls']
    """
    return cli_args(CREATE_FLAGS, options, "podman create")


def run_argv(options: Mapping[str, Any], *, rootless: bool | None = None) -> list[str]:
    """The ``podman run`` line that runs a container of docker-py *options* as builder does (``builder run
    --dry-run``), removed when it ends: from the table :meth:`PodmanEngine.create` creates containers with, with
    the same ``--userns keep-id`` (*rootless*: by default, whether this process is not root, as the podman CLI
    it names then runs) and the ``--tls-verify=false`` its pull from a loopback registry takes.

    Example:
        >>> run_argv({"image": "localhost:5000/r:gpu", "command": ["true"], "device_requests": [
        ...     {"Driver": "cdi", "DeviceIDs": ["nvidia.com/gpu=all"]}]})
        ['podman', 'run', '--rm', '--tls-verify=false', '--device', 'nvidia.com/gpu=all', 'localhost:5000/r:gpu', 'true']
    """
    rootless = os.geteuid() != 0 if rootless is None else rootless
    keep_id = ["--userns", "keep-id"] if rootless and own_user(options) else []
    return ["podman", "run", "--rm", *_tls(registry.Ref.parse(str(options["image"])).host), *keep_id,
            *_create_argv(options)]


def _tls(host: str | None) -> list[str]:
    """Plain http for a loopback registry (Docker assumes it; podman must be told)."""
    return ["--tls-verify=false"] if host and registry.is_local(host) else []
