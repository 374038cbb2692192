"""``builder doctor``: is this host ready to build and run the images?

Each check gives one :class:`Check`: ``ok``, ``warn`` or ``fail``, the item, what was found,
and for problems the exact fix. GPU checks run only for the vendors whose GPUs are on the
PCI bus. The config check never stops the others: a broken matrix.yaml is one FAIL item.

Example:
    >>> for check in run_checks(Path("matrix.yaml")):  # doctest: +SKIP
    ...     print(check.line())
    [OK]   docker daemon: Docker 26.1.5+dfsg1 (API 1.45) at unix:///var/run/docker.sock, containerd image store ...
    ...
"""

from __future__ import annotations

import grp
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from requests.exceptions import RequestException

from builder.config import platforms
from builder.config.errors import UserError
from builder.config.project import Project, load_project
from builder.host import cdi, devices, hardware
from builder.oci import buildkit, docker, localregistry, podman, registry
from builder.oci.docker import DockerEngine, engine_address
from builder.oci.engine import Engine, EngineFacts, chosen_engine, engine_version
from builder.oci.secrets import PLAIN, child_env

Status = Literal["ok", "warn", "fail"]
#: A CUDA or ROCm image with its build cache needs tens of GiB.
MIN_FREE_GIB = 30
DAEMON_FIX = "systemctl start docker (or: dockerd &), or point DOCKER_HOST at a running engine"
TOOLKIT_FIX = (
    "apt-get install nvidia-container-toolkit && nvidia-ctk runtime configure --runtime=docker "
    "&& systemctl restart docker "
    "(or generate a CDI spec: nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml)"
)


@dataclass(frozen=True)
class Check:
    """One doctor item.

    Example:
        >>> Check("fail", "mmdebstrap", "not installed", "apt-get install mmdebstrap").line()
        '[FAIL] mmdebstrap: not installed\\n       fix: apt-get install mmdebstrap'
    """

    status: Status
    item: str
    found: str
    fix: str | None = None

    def line(self) -> str:
        tag = f"[{self.status.upper()}]".ljust(6)
        text = f"{tag} {self.item}: {self.found}"
        return text + (f"\n       fix: {self.fix}" if self.fix and self.status != "ok" else "")


@dataclass
class Context:
    """What the checks share: the engine (if it answered), its info, the project, the host's GPUs."""

    host: hardware.HostGpus
    matrix_path: Path | str = "matrix.yaml"
    mapping_path: Path | str | None = None
    engine: Engine | None = None
    info: EngineFacts | None = None
    project: Project | None = None
    cdi: tuple[str, ...] = ()
    cdi_dirs: tuple[str, ...] = hardware.CDI_DIRS
    #: the engine ``--engine`` names (None: BUILDER_ENGINE, else Docker, then podman)
    choice: str | None = None


#: What each image store means for the user.
STORE_NOTE = {
    "containerd": " (image IDs are manifest digests; zstd layers kept as pushed)",
    "classic": " (overlay2; BuildKit's compression setting is not kept when it stores images)",
}


def check_daemon(ctx: Context) -> list[Check]:
    """The engine (``--engine``/BUILDER_ENGINE, else Docker, then podman when Docker does not answer):
    reachable, its version and API version, its image store (podman: rootful or rootless), what it lacks."""
    try:
        kind = chosen_engine(ctx.choice)
    except UserError as exc:
        return [Check("fail", "engine", str(exc), "BUILDER_ENGINE=docker or BUILDER_ENGINE=podman")]
    checks = []
    if kind != "podman":
        checks = _check_docker(ctx)
    if kind == "podman" or (kind is None and checks[0].status == "fail" and shutil.which("podman") is not None):
        checks = _check_podman(ctx)
    if ctx.engine is not None and (lacks := ctx.engine.lacks()).items:
        checks.append(Check("warn", f"{ctx.engine.name()} lacks", "; ".join(lacks.items), lacks.fix))
    return checks


def _check_podman(ctx: Context) -> list[Check]:
    try:
        found_engine = podman.connect_podman(timeout=15)
        info = ctx.info = found_engine.info()
    except (UserError, docker.ClientError, RequestException, OSError) as exc:
        return [Check("fail", "podman", str(exc).splitlines()[0][:300],
                      "apt-get install podman buildah (make host ENGINE=podman)")]
    ctx.engine = found_engine
    mode = "rootless" if found_engine.rootless() else "rootful"
    found = (f"podman {info.version} (API {info.api_version}), {mode}, at {found_engine.address()}, {info.driver} "
             "storage (layers kept uncompressed; compression chosen at push)")
    return [Check("ok", "podman", found), *([_rootless_network(TUN)] if mode == "rootless" else [])]


#: The device rootless podman's container network (slirp4netns; pasta from podman 5) opens.
TUN = Path("/dev/net/tun")


def _rootless_network(tun: Path) -> Check:
    """Whether a rootless ``builder run`` can have a network: builds and smoke tests need none."""
    if os.access(tun, os.R_OK | os.W_OK):
        return Check("ok", "rootless network", f"{tun} is open to you: builder run's containers get podman's network")
    return Check("warn", "rootless network",
                 f"{tun} is not open to you: builder run cannot start a container (its network, slirp4netns or "
                 "pasta, opens it); builds and smoke tests need no network", f"sudo chmod 0666 {tun} (Debian's default)")


def _check_docker(ctx: Context) -> list[Check]:
    try:
        found_engine = DockerEngine.from_env(timeout=15)
        info = ctx.info = found_engine.info()
    except (docker.ClientError, RequestException, OSError) as exc:
        reason = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        return [Check("fail", "docker daemon", f"no engine answers at {engine_address()} ({reason})", DAEMON_FIX)]
    ctx.engine = found_engine
    found = (f"Docker {info.version} (API {info.api_version}) at {engine_address()}, "
             f"{info.store} image store{STORE_NOTE[info.store]}")
    if engine_version(info.version) < docker.MIN_ENGINE:
        need = ".".join(map(str, docker.MIN_ENGINE))
        return [Check("fail", "docker daemon", f"{found}; builder needs Docker >= {need}",
                      "upgrade the engine: scripts/setup-host.sh prints the command (Debian 12: docker.io from "
                      "Debian 13, pinned)")]
    return [Check("ok", "docker daemon", found)]


def check_buildkit(ctx: Context) -> list[Check]:
    """docker buildx (BuildKit's client): every Docker build goes through it (podman builds with its buildah)."""
    if ctx.info is not None and ctx.info.builds_with != "docker buildx":
        return [Check("ok", "builds", f"{ctx.info.builds_with}; docker buildx not needed")]
    found = buildkit.version()  # one `docker buildx version`; the reason only when it failed
    if not found:
        problem = buildkit.available() or "docker buildx version failed"
        return [Check("fail", "buildx", problem, "apt-get install docker.io docker-buildx (scripts/setup-host.sh)")]
    builder = os.environ.get("BUILDX_BUILDER") or "the engine's own (docker driver)"
    return [Check("ok", "buildx", f"{found}; builder: {builder}")]


#: The first releases that pull zstd layers (OCI media types); docs/building.md has the sources.
ZSTD_DOCKER = (23, 0)
ZSTD_ENROOT = (4, 0)


def _enroot_version() -> tuple[int, int] | None:
    """This host's enroot (Slurm's pyxis imports through it), or None where it is not installed."""
    if shutil.which("enroot") is None:
        return None
    proc = subprocess.run(["enroot", "version"], capture_output=True, text=True, check=False, timeout=10,
                          env=child_env(PLAIN))
    return engine_version(proc.stdout)


def check_compression(ctx: Context, enroot: Callable[[], tuple[int, int] | None] = _enroot_version) -> list[Check]:
    """What the matrix publishes (zstd, gzip) and whether this host's engine (and enroot) could pull it."""
    if ctx.project is None or ctx.info is None:
        return []
    zstd = sorted({t.name for t in ctx.project.targets if t.compression == "zstd"})
    if not zstd:
        return [Check("ok", "compression", "gzip layers: every engine, enroot and pyxis pull them")]
    names, fix = ", ".join(zstd), "set compression: gzip (top level, or per target) for the nodes that run them"
    version, at_push = ctx.info.version, ctx.info.compresses_at_push
    if at_push:
        # podman's version is its own (5.4.2), no Docker release; containers/image pulls zstd in every podman
        # builder takes (>= 4.3), and podman keeps no image store that decides the compression: its push does
        checks = [Check("ok", "compression", f"{names} publish zstd layers (OCI media types): {ctx.info.product} "
                        "pulls them and compresses at push; older consumers: docs/building.md#compression")]
    elif engine_version(version) < ZSTD_DOCKER:
        checks = [Check("warn", "compression", f"{names} publish zstd layers: this engine (Docker {version}) cannot "
                        "pull them (Docker >= 23.0 can)", f"upgrade the engine, or {fix}")]
    else:
        checks = [Check("ok", "compression", f"{names} publish zstd layers (OCI media types): this engine pulls them; "
                        "older consumers: docs/building.md#compression")]
    found = enroot()
    if found is not None and found < ZSTD_ENROOT:
        checks.append(Check("warn", "compression", f"{names} publish zstd layers: this host's enroot "
                            f"{'.'.join(map(str, found))} (Slurm's pyxis) cannot import them (enroot >= 4.0.0 can)",
                            f"upgrade enroot, or set ENROOT_GZIP_PROGRAM=zstd for its imports, or {fix}"))
    if not at_push and ctx.info.store == "classic":
        checks.append(Check("warn", "compression", "this engine's classic image store keeps gzip whatever BuildKit "
                            "writes, so these targets are published gzip from here",
                            'enable the containerd image store: {"features": {"containerd-snapshotter": true}} '
                            "in /etc/docker/daemon.json, then restart dockerd"))
    return checks


def check_gpus(ctx: Context) -> list[Check]:
    """What GPUs the PCI bus shows, and which vendor ``builder run`` would pick."""
    host = ctx.host
    if not host.gpus:
        return [Check("ok", "gpus", "none on the PCI bus; builder run uses the cpu image")]
    found = "; ".join(f"{v}: {host.describe(v)}" for v in host.present())
    try:
        vendor, why = hardware.choose_vendor(host)
    except UserError as exc:
        return [Check("fail", "gpus", f"{found}; {exc.lines[0]}", f"unset {hardware.VENDOR_ENV} or fix its value")]
    return [Check("ok", "gpus", f"{found}; builder run picks {vendor} ({why})")]


def check_nvidia(ctx: Context) -> list[Check]:
    """NVIDIA driver nodes and the engine's NVIDIA runtime or a CDI spec (only with an NVIDIA GPU)."""
    host = ctx.host
    if not host.of("nvidia"):
        return []
    checks = []
    if hardware.has_nvidia_gpu_node(host.nodes):
        checks.append(Check("ok", "nvidia driver", f"{', '.join(host.nodes.nvidia)}"))
    else:
        checks.append(Check("fail", "nvidia driver", f"GPU(s) {host.describe('nvidia')} but no /dev/nvidia[0-9]*",
                            "install the NVIDIA driver (apt-get install nvidia-driver) and reboot; nvidia-smi must work"))
    runtimes = ctx.info.runtimes if ctx.info is not None else ()
    cdi_only = ctx.info is not None and ctx.info.gpus_by_cdi_only
    choice = devices.choose_cdi("nvidia", cdi.specs(ctx.cdi_dirs, devices.CDI_KINDS["nvidia"]),
                                devices.engine_cdi(ctx.info)) if cdi_only else None
    if choice is not None and choice.use:
        specs = ", ".join(hardware.cdi_specs(ctx.cdi_dirs))
        checks.append(Check("ok", "nvidia runtime", f"CDI spec for nvidia.com/gpu: {specs}"))
    elif choice is not None:
        why, make = devices.cdi_only("nvidia", choice)
        checks.append(Check("fail", "nvidia runtime", why, f"apt-get install nvidia-container-toolkit && {make}"))
    elif "nvidia" in runtimes:
        checks.append(Check("ok", "nvidia runtime", f"registered in the engine (runtimes: {', '.join(runtimes)})"))
    elif ctx.cdi:
        checks.append(Check("ok", "nvidia runtime", f"CDI spec for nvidia.com/gpu: {', '.join(ctx.cdi)}"))
    elif ctx.info is None:
        checks.append(Check("warn", "nvidia runtime", "not checked: no engine answered", DAEMON_FIX))
    else:
        checks.append(Check("fail", "nvidia runtime", f"not in the engine's runtimes ({', '.join(runtimes) or 'none'}) "
                            f"and no CDI spec in {' or '.join(hardware.CDI_DIRS)}", TOOLKIT_FIX))
    return checks


def check_cdi(ctx: Context) -> list[Check]:
    """How ``builder run`` and the Slurm script hand over each present vendor's GPUs: CDI name or classic flags."""
    checks = []
    classic = {"nvidia": "--gpus all", "amd": "--device /dev/kfd --device /dev/dri", "intel": "--device /dev/dri"}
    cdi_only = ctx.info is not None and ctx.info.gpus_by_cdi_only
    for vendor in ctx.host.present():
        kind = devices.CDI_KINDS.get(vendor)
        if kind is None:
            continue
        choice = devices.choose_cdi(vendor, cdi.specs(ctx.cdi_dirs, kind), devices.engine_cdi(ctx.info))
        if cdi_only and not choice.use and vendor in devices.CDI_GENERATE:
            continue  # none: check_nvidia says why, and the fix
        flag = " ".join(f"--device {d}" for d in choice.devices) if choice.use else classic[vendor]
        checks.append(Check("ok", f"{vendor} devices", f"builder run uses {flag}: {choice.why}"))
    return checks


def _access(path: str) -> Check:
    """Whether the invoking user may open *path* read-write, and the group that would let it."""
    info = os.stat(path)
    try:
        group = grp.getgrgid(info.st_gid).gr_name
    except KeyError:
        group = str(info.st_gid)
    found = f"{path} (group {group}, GID {info.st_gid})"
    if os.access(path, os.R_OK | os.W_OK):
        return Check("ok", f"access {path}", f"{found}; builder run adds GID {info.st_gid} to the container")
    return Check("fail", f"access {path}", f"{found}: not readable and writable by you",
                 f"sudo usermod -aG {group} $USER, then log in again")


def check_amd_intel(ctx: Context) -> list[Check]:
    """/dev/kfd and /dev/dri present and usable by the invoking user (only with AMD or Intel GPUs)."""
    host, nodes = ctx.host, ctx.host.nodes
    checks = []
    if host.of("amd"):
        checks.append(Check("ok", "amd /dev/kfd", nodes.kfd) if nodes.kfd else Check(
            "fail", "amd /dev/kfd", f"GPU(s) {host.describe('amd')} but no /dev/kfd",
            "install the amdgpu driver with KFD (amdgpu-install --usecase=rocm) and reboot"))
    if host.of("amd") or host.of("intel"):
        if nodes.render:
            checks.append(Check("ok", "/dev/dri", f"render nodes {', '.join(nodes.render)}"))
        else:
            vendors = " and ".join(v for v in ("amd", "intel") if host.of(v))
            checks.append(Check("fail", "/dev/dri", f"{vendors} GPU(s) but no /dev/dri/renderD* node",
                                "load the GPU driver (amdgpu, i915 or xe) and reboot"))
        for path in ([nodes.kfd] if nodes.kfd and host.of("amd") else []) + list(nodes.render):
            checks.append(_access(path))
        names = hardware.group_gids(["video", "render"])
        if names:
            gids = ", ".join(f"{k} {v}" for k, v in names.items())
            checks.append(Check("ok", "gpu groups", f"host GIDs {gids}; the image's differ, builder run adds these"))
    return checks


def check_disk(ctx: Context) -> list[Check]:
    """Free space where the engine keeps images (``docker info`` DockerRootDir)."""
    if ctx.info is None:
        return [Check("warn", "docker disk", "not checked: no engine answered", DAEMON_FIX)]
    item = f"{ctx.info.product.lower()} disk"
    root = ctx.info.root or "/var/lib/docker"
    try:
        free = shutil.disk_usage(root).free / 2**30
    except OSError:
        return [Check("warn", item, f"{root} is not visible from here (remote engine?); not checked")]
    found = f"{free:.1f} GiB free at {root}"
    if free < MIN_FREE_GIB:
        return [Check("warn", item, f"{found}; GPU images need >= {MIN_FREE_GIB} GiB", ctx.info.disk_fix)]
    return [Check("ok", item, found)]


def check_registry(ctx: Context) -> list[Check]:
    """The matrix's registry answers /v2/."""
    if ctx.project is None:
        return [Check("warn", "registry", "not checked: the project did not load")]
    host = registry.Ref.parse(ctx.project.matrix.registry).host
    if registry.ping(host):
        if registry.is_local(host):  # not trusted for answering: the builder's own, or one with your login
            try:
                localregistry.check(host)
            except (UserError, registry.RegistryFault) as exc:
                found, _, fix = str(exc).partition("; ")
                return [Check("fail", "registry", found, fix or None)]
        return [Check("ok", "registry", f"{host} answers /v2/")]
    if registry.is_local(host):
        return [Check("warn", "registry", f"nothing answers at {host} (a loopback registry builder starts on demand)",
                      "'builder base' and 'builder build --push' start it (docker-registry) when they need it")]
    return [Check("fail", "registry", f"{host} does not answer /v2/",
                  f"check 'registry' in {ctx.project.matrix_path.name}, the network, and 'docker login {host}'")]


def check_tools(ctx: Context) -> list[Check]:
    """mmdebstrap (``builder base``) and docker-registry (a loopback registry for ``make images``)."""
    checks = []
    for tool, needed, why in (
        ("mmdebstrap", ctx.project is None or ctx.project.matrix.base.bootstrap is not None,
         "builder base bootstraps the base with it"),
        ("docker-registry", ctx.project is None or registry.is_local(registry.Ref.parse(ctx.project.matrix.registry).host),
         "make images pushes to a loopback registry it serves"),
    ):
        path = shutil.which(tool)
        if path:
            checks.append(Check("ok", tool, path))
        elif needed:
            checks.append(Check("fail", tool, f"not installed ({why})", f"apt-get install {tool}"))
        else:
            checks.append(Check("ok", tool, "not installed; not needed by this matrix"))
    return checks


def check_emulation(ctx: Context, binfmt: Path = platforms.BINFMT) -> list[Check]:
    """Each foreign platform the matrix lists runs under qemu: its binfmt_misc handler, with the F flag."""
    if ctx.project is None:
        return [Check("warn", "emulation", "not checked: the project did not load")]
    host = platforms.host_platform()
    foreign = sorted({p for t in ctx.project.targets for p in t.platforms} - {host})
    if not foreign:
        return [Check("ok", "emulation", f"not needed: every target is built for this host's {host} only")]
    checks = []
    for platform in foreign:
        problem = platforms.emulation_problem(platform, binfmt)
        users = ", ".join(t.name for t in ctx.project.targets if platform in t.platforms)
        if problem is None:
            checks.append(Check("ok", f"emulation {platform}", f"qemu-{platforms.machine(platform)} registered "
                                f"(F flag) for {users}"))
        else:
            what, _, fix = problem.partition(": ")
            checks.append(Check("fail", f"emulation {platform}", f"{what} (needed by {users})", fix))
    return checks


def check_config(ctx: Context) -> list[Check]:
    """The project loads; a missing or stale base pin is a WARN (loads unpinned), other problems a FAIL."""
    name = Path(ctx.matrix_path).name
    try:
        ctx.project = load_project(ctx.matrix_path, ctx.mapping_path)
        return [Check("ok", "config", f"{name}: {len(ctx.project.targets)} targets, registry {ctx.project.matrix.registry}")]
    except UserError as exc:
        strict = exc
    try:
        ctx.project = load_project(ctx.matrix_path, ctx.mapping_path, allow_unpinned=True)
    except UserError as exc:
        return [Check("fail", "config", "; ".join(exc.lines), f"fix {name} as the message says")]
    return [Check("warn", "config", "; ".join(strict.lines), "run 'builder base' to bootstrap and pin the base")]


CHECKS: tuple[Callable[[Context], list[Check]], ...] = (
    check_daemon, check_buildkit, check_gpus, check_nvidia, check_amd_intel, check_cdi, check_disk, check_config,
    check_registry, check_tools, check_emulation, check_compression,
)


def run_checks(
    matrix_path: Path | str = "matrix.yaml",
    mapping_path: Path | str | None = None,
    *,
    sysfs_root: Path | str = "/sys",
    dev_root: Path | str = "/dev",
    cdi_dirs: Iterable[Path | str] = hardware.CDI_DIRS,
    engine: str | None = None,
) -> list[Check]:
    """All checks, in order; never raises for a host or config problem.

    Example:
        >>> [c.status for c in run_checks("matrix.yaml")][:1]  # doctest: +SKIP
        ['ok']
    """
    dirs = tuple(str(d) for d in cdi_dirs)
    cdi = tuple(hardware.cdi_specs(dirs))
    host = hardware.detect(sysfs_root, dev_root, nvidia_runtime=bool(cdi))
    ctx = Context(host, matrix_path, mapping_path, cdi=cdi, cdi_dirs=dirs, choice=engine)
    checks: list[Check] = []
    for check in CHECKS:
        try:
            checks += check(ctx)
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
            checks.append(Check("fail", check.__name__.removeprefix("check_"), f"the check crashed: {exc!r}",
                                "report this as a builder bug"))
    if ctx.engine is not None:
        ctx.engine.close()
    return checks


def store_checks(held: dict[str, tuple[int, str]] | None, why: str = "") -> list[Check]:
    """What each store of the builder's holds (bytes, where), as measured by the image build
    (:func:`builder.gc.stores.collect`, which the cli hands in: this layer never imports it).

    Example:
        >>> store_checks({"wheelhouse": (3_100_000_000, "/home/u/.cache/ml-image-builder/wheels")})[0].line()
        '[OK]   store wheelhouse: 3.1 GB at /home/u/.cache/ml-image-builder/wheels; builder gc --dry-run: what can go'
    """
    if held is None:
        return [Check("warn", "stores", f"not measured ({why})")]
    checks = []
    for store, (size, where) in held.items():
        at = f" at {where}" if where else ""
        checks.append(Check("ok", f"store {store}", f"{size / 1e9:.1f} GB{at}; builder gc --dry-run: what can go"))
    return checks


def exit_status(checks: Iterable[Check]) -> int:
    """0 without a FAIL, 1 otherwise."""
    return 1 if any(c.status == "fail" for c in checks) else 0


def as_json(checks: list[Check]) -> dict[str, Any]:
    return {"ok": exit_status(checks) == 0, "checks": [asdict(c) for c in checks]}
