#!/usr/bin/env bash
# Make this host ready for `make images` and `make test`: the Debian packages they need, a current
# Docker engine (26.1 or newer, with BuildKit) that answers. Run by the Makefile before both
# commands and by .ci/run; safe to run again (it only acts on what is missing).
#
# The engine that is there is used as it is: Docker CE (docker-ce, containerd.io: Docker's install
# guide), Moby's packages, Docker Desktop or any engine that answers. Nothing of an engine is
# installed beside it (Debian's containerd conflicts with containerd.io), and apt never removes a
# package (--no-remove: a conflict stops with one line, apt's own output above it). Debian's engine
# (docker.io, containerd, docker-buildx) is installed only where there is none.
#
#   scripts/setup-host.sh            install what is missing (root: apt-get; else print the line)
#                                    and start dockerd when no engine answers (root only)
#   SETUP_HOST_PIDFILE=F ...         write the PID of a dockerd this script started to F
#   ENGINE=podman ...                the engine is podman (+ buildah): installed beside whatever is
#                                    there (Docker's packages stay), and no dockerd is started
#   CI=true ...                      also upgrade an engine older than 26 in place (CI machines are
#                                    reused); on a user's machine that is only ever printed
#
# Exit 0 when the host is ready, 1 with one line naming the fix when it is not.
set -euo pipefail

# The engine and the verifiers. Debian 12 (bookworm) ships Docker 20.10 (end-of-life), so there
# they come from Debian 13 (trixie) with its security updates (trixie-security), whose builds need
# only libc >= 2.34; an apt pin keeps every other package on bookworm (runc, tini, iptables stay
# bookworm's: trixie's runc needs glibc 2.38).
#   docker.io        dockerd 26.1 and its client; containerd 1.7 (the image store and runtime)
#   docker-buildx    BuildKit's client (docker buildx build / bake)
ENGINE_PACKAGES=(docker.io containerd docker-buildx)
# Beside any engine (they never touch it):
#   cosign oras      the standard verifiers the tests run against the registry (cosign verify,
#                    oras discover)
#   pigz             the engine unpacks gzip layers with unpigz (faster pulls)
TOOL_PACKAGES=(cosign oras pigz)
# With ENGINE=podman, podman and what rootless use needs, from the host's own suite:
#   podman buildah   the engine and its builder (Debian 12: 4.3.1 and 1.28; Debian 13: 5.4 and 1.39)
#   uidmap           newuidmap/newgidmap: a rootless user's subordinate IDs (/etc/subuid, /etc/subgid)
#   slirp4netns      a rootless container's network
#   fuse-overlayfs   rootless overlay storage where the kernel's overlayfs can't be mounted by a user
#   zstd             recompresses a layer podman < 4.7 reused in another compression (the base's)
#   nftables         nft, which netavark (podman 5's network, Debian 13) runs for every container with a
#                    network (builder run): netavark only recommends it, and apt here installs no
#                    recommends ("netavark: nftables error: unable to execute nft" without it)
#   passt            pasta, a rootless container's network from podman 5 (slirp4netns before)
PODMAN_PACKAGES=(podman buildah uidmap slirp4netns passt fuse-overlayfs zstd nftables)
ENGINE=${ENGINE:-docker}
case "$ENGINE" in
  docker | podman) ;;
  *) printf 'setup-host: ENGINE=%s is no engine; use ENGINE=docker or ENGINE=podman\n' "$ENGINE" >&2; exit 2 ;;
esac
# Another engine's packages: Docker CE (Docker's own repository) and Moby's. With any of them
# installed, that engine is the one used, and ENGINE_PACKAGES are never installed beside it.
OTHER_ENGINE=(docker-ce docker-ce-cli containerd.io docker-buildx-plugin moby-engine moby-cli moby-containerd moby-runc
  moby-buildx)
# The rest, from the host's own suite:
#   mmdebstrap       bootstraps the shared base image
#   arch-test        lets mmdebstrap bootstrap a foreign architecture's base (under qemu)
#   docker-registry  the local registry images are pushed to, and the tests' registries
#   busybox-static   the launcher tests' 2 MB stand-in image (a static binary)
#   qemu-user-static runs the other architecture's binaries (linux/arm64 on x86_64 and back),
#                    for builds and smoke tests of a foreign platform (binfmt_misc, below)
#   skopeo           reads the published image indexes back in the tests
#   slurm-wlm munge  a real Slurm cluster on loopback for the `builder slurm` tests (slurmctld, two
#                    slurmd, munged: started and stopped by the tests, never as services)
PACKAGES=(mmdebstrap arch-test docker-registry busybox-static qemu-user-static skopeo slurm-wlm munge)
# Their services, which the tests start and stop themselves: the install neither starts nor enables them.
declare -A SERVICES=([docker-registry]=docker-registry [slurm-wlm]="slurmctld slurmd" [munge]=munge)
MIN_ENGINE=26

say() { printf 'setup-host: %s\n' "$*" >&2; }
root() { [ "$(id -u)" = 0 ]; }
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'; }
major() { printf '%s' "${1%%.*}" | tr -cd 0-9; }
codename=$(. /etc/os-release 2>/dev/null && printf '%s' "${VERSION_CODENAME:-}")

TRIXIE_SOURCES=/etc/apt/sources.list.d/ml-image-builder-trixie.sources
TRIXIE_PIN=/etc/apt/preferences.d/ml-image-builder-trixie
# Debian 12 only: Debian 13's suite at priority 100 (never chosen on its own), the engine's
# packages at 500 (the newer version wins, so they come from trixie and stay current there).
trixie_suite() {
  [ "$codename" = bookworm ] || return 0
  # Current when both files name trixie-security (those an earlier version wrote lack it).
  grep -qs trixie-security "$TRIXIE_SOURCES" && grep -qs trixie-security "$TRIXIE_PIN" && return 0
  local pinned="${ENGINE_PACKAGES[*]} ${TOOL_PACKAGES[*]}"
  say "Debian 12 ships Docker 20.10: adding Debian 13's suite and trixie-security to apt ($TRIXIE_SOURCES),"
  say "  pinned ($TRIXIE_PIN) so that only $pinned come from them; everything else stays on bookworm"
  cat >"$TRIXIE_SOURCES" <<'EOF'
# Added by ml-image-builder's scripts/setup-host.sh: Docker 26 and cosign/oras from Debian 13, with
# its security updates. The pin beside it (/etc/apt/preferences.d/ml-image-builder-trixie) keeps
# the rest on bookworm.
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: trixie-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  cat >"$TRIXIE_PIN" <<EOF
# Added by ml-image-builder's scripts/setup-host.sh: only the engine's packages and the tools from
# trixie and trixie-security.
Package: *
Pin: release n=trixie
Pin-Priority: 100

Package: *
Pin: release n=trixie-security
Pin-Priority: 100

Package: $pinned
Pin: release n=trixie
Pin-Priority: 500

Package: $pinned
Pin: release n=trixie-security
Pin-Priority: 500
EOF
}

# The install neither starts nor enables the SERVICES of the packages it installs: for its time a
# policy-rc.d answers 101 (action forbidden) for them, which invoke-rc.d and deb-systemd-invoke
# obey, with or without systemd; where systemd runs they are masked too (no start at boot:
# `systemctl unmask` to run one as a service). A policy-rc.d already there (containers have one)
# is the host's and stays as it is.
POLICY=${SETUP_HOST_POLICY_RC:-/usr/sbin/policy-rc.d}
policy_ours=
quiet_services() {
  local services=() package
  # shellcheck disable=SC2206 # a package's services: words
  for package in "$@"; do services+=(${SERVICES[$package]:-}); done
  ((${#services[@]})) || return 0
  if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\n# Written by ml-image-builder scripts/setup-host.sh for its apt-get install; removed after it.\ncase "$1" in %s) exit 101 ;; esac\nexit 0\n' \
      "$(IFS='|'; printf '%s' "${services[*]}")" >"$POLICY"
    chmod 755 "$POLICY"
    policy_ours=1
  fi
  if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemctl mask --quiet "${services[@]/%/.service}" || true
    say "masked ${services[*]}: the tests start them themselves (systemctl unmask to run one as a service)"
  else
    say "the install does not start ${services[*]}: the tests start them themselves"
  fi
}
trap '[ -z "$policy_ours" ] || rm -f "$POLICY"' EXIT

# The engine that answers, and the one installed (major versions; empty when none).
answering=$(docker version --format '{{.Server.Version}}' 2>/dev/null || true)
packaged=$(installed docker.io && dpkg-query -W -f='${Version}' docker.io 2>/dev/null || true)
# The engine that is there, used as it is: another engine's packages, or one that answers without
# Debian's package (Docker Desktop, a static install, DOCKER_HOST elsewhere).
other=()
for package in "${OTHER_ENGINE[@]}"; do installed "$package" && other+=("$package"); done
as_is=
if ((${#other[@]})); then
  as_is="Docker's own packages (${other[*]})"
elif [ -n "$answering" ] && [ -z "$packaged" ]; then
  as_is="Docker $answering, which answers (not Debian's docker.io)"
fi
upgrade=
if [ "$ENGINE" = docker ] && [ -n "$packaged" ] && [ "$(major "$packaged")" -lt "$MIN_ENGINE" ]; then
  if [ "${CI:-}" = true ]; then
    upgrade=1
    say "CI: Docker $packaged is installed (needs >= $MIN_ENGINE): upgrading it in place"
  elif [ -n "$answering" ] || [ "$codename" = bookworm ]; then
    say "Docker $packaged is installed; this project needs Docker >= $MIN_ENGINE.0 with BuildKit. It is not replaced"
    say "  behind your back: upgrade it with: sudo CI=true $0"
    exit 1
  fi
fi

missing=()
for package in "${PACKAGES[@]}" "${TOOL_PACKAGES[@]}"; do installed "$package" || missing+=("$package"); done
if [ "$ENGINE" = podman ]; then
  for package in "${PODMAN_PACKAGES[@]}"; do installed "$package" || missing+=("$package"); done
elif [ -n "$as_is" ]; then
  not=()
  for package in "${ENGINE_PACKAGES[@]}"; do installed "$package" || not+=("$package"); done
  ((${#not[@]} == 0)) || say "using the engine that is there, $as_is, as it is: not installing ${not[*]} beside it"
else
  for package in "${ENGINE_PACKAGES[@]}"; do
    installed "$package" && [ -z "$upgrade" ] || missing+=("$package")
  done
fi

new_engine=
if ((${#missing[@]})); then
  if ! root; then
    [ "$codename" = bookworm ] && [ ! -f "$TRIXIE_PIN" ] && say "run 'sudo $0' (it adds Debian 13's suite for Docker 26, pinned)"
    say "missing Debian packages; run: sudo apt-get install -y --no-install-recommends ${missing[*]}"
    exit 1
  fi
  trixie_suite
  quiet_services "${missing[@]}"
  say "installing ${missing[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # --no-remove: an install that needs a package removed (a conflict) stops here; nothing is removed.
  apt_out=$(mktemp)
  if ! apt-get install -y -qq --no-install-recommends --no-remove -o Dpkg::Options::=--force-confold \
    "${missing[@]}" >"$apt_out" 2>&1; then
    tail -n 25 "$apt_out" >&2
    rm -f "$apt_out"
    say "apt-get cannot install ${missing[*]} without removing a package (its output above); nothing was removed: resolve that, then run $0 again"
    exit 1
  fi
  rm -f "$apt_out"
  [[ " ${missing[*]} " == *" docker.io "* ]] && new_engine=1
fi

# A new install gets the containerd image store, as Engine 29 and Docker Desktop do for new
# installs, and a bound on BuildKit's cache: 30GB holds two full sets of cpu + nvidia-cu130
# (layers and wheel copies, ~13 GB a set, estimated): today's and the one before a relock; older records
# go first (docs/commands.md#what-the-builder-keeps). An existing daemon.json is the user's: never changed
# (switching stores hides images); the line to add is printed. The one exception is the file this
# script wrote before it set the bound (byte for byte): that one is ours, and gets the bound.
gc_policy='"builder": {"gc": {"enabled": true, "defaultKeepStorage": "30GB"}}'
ours_before=$'{\n  "features": {"containerd-snapshotter": true}\n}'
ours_now=$(printf '{\n  "features": {"containerd-snapshotter": true},\n  %s\n}' "$gc_policy")
if [ -n "$new_engine" ] && [ ! -s /etc/docker/daemon.json ]; then
  mkdir -p /etc/docker
  printf '%s\n' "$ours_now" >/etc/docker/daemon.json
  say "wrote /etc/docker/daemon.json: the containerd image store (Engine 29's default for new installs), BuildKit's cache kept under 30GB"
elif root && [ "$(cat /etc/docker/daemon.json 2>/dev/null)" = "$ours_before" ]; then
  printf '%s\n' "$ours_now" >/etc/docker/daemon.json
  say "added BuildKit's 30GB bound to /etc/docker/daemon.json (an earlier setup-host wrote it; the image store is unchanged);"
  say "  it holds from dockerd's next start"
elif [ -s /etc/docker/daemon.json ] && ! grep -q '"defaultKeepStorage"' /etc/docker/daemon.json; then
  say "BuildKit's cache is unbounded here: add $gc_policy to /etc/docker/daemon.json, then restart dockerd"
fi

# CDI device names (--device vendor.com/gpu=all: builder run and the Slurm script use them where the
# host has a CDI spec): Docker reads CDI specs only with "features": {"cdi": true} in daemon.json, until
# 28.2 turned it on by default. Below 28.2 it is merged into daemon.json (made if absent; every other key
# stays as it is, a "cdi" already there too); it holds from dockerd's next start. python3 merges it (the
# builder needs it anyway).
daemon_json=/etc/docker/daemon.json
cdi_line='"features": {"cdi": true}'
engine_version=$answering
if [ -z "$engine_version" ]; then
  for package in docker.io docker-ce moby-engine; do
    if installed "$package"; then engine_version=$(dpkg-query -W -f='${Version}' "$package"); break; fi
  done
fi
engine_version=${engine_version#*:} # dpkg's epoch: 5:28.5.1-1~debian.12~bookworm
# 0 when Docker $1 reads CDI specs without the setting (28.2 and later).
cdi_by_default() {
  local ma mi
  ma=$(major "$1")
  mi=$(printf '%s' "$1" | cut -d. -f2 | tr -cd 0-9)
  [ "${ma:-0}" -gt 28 ] || { [ "${ma:-0}" -eq 28 ] && [ "${mi:-0}" -ge 2 ]; }
}
# Sets features.cdi in the daemon.json $1, keeping the rest: exit 3 when it has a "cdi" already, 4 when
# it is not a JSON object.
cdi_on() {
  python3 - "$1" <<'PY'
import json
import sys

path = sys.argv[1]
try:
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
except FileNotFoundError:
    text = ""
try:
    conf = json.loads(text) if text.strip() else {}
except ValueError:
    sys.exit(4)
if not isinstance(conf, dict) or not isinstance(conf.setdefault("features", {}), dict):
    sys.exit(4)
if "cdi" in conf["features"]:
    sys.exit(3)
conf["features"]["cdi"] = True
with open(path, "w", encoding="utf-8") as handle:
    handle.write(json.dumps(conf, indent=2) + "\n")
PY
}
if [ -n "$engine_version" ] && ! cdi_by_default "$engine_version"; then
  if ! root || ! command -v python3 >/dev/null 2>&1; then
    grep -qs '"cdi"' "$daemon_json" ||
      say "Docker $engine_version reads CDI specs only with $cdi_line in $daemon_json: add it (sudo $0 does), then restart dockerd"
  else
    mkdir -p "$(dirname "$daemon_json")"
    cdi=0
    cdi_on "$daemon_json" || cdi=$?
    case $cdi in
      0) say "turned on Docker's CDI ($cdi_line) in $daemon_json: CDI device names work from dockerd's next start" ;;
      3) ;;
      4) say "$daemon_json is not a JSON object: add $cdi_line to it yourself (CDI device names), then restart dockerd" ;;
      *) say "python3 could not merge $cdi_line into $daemon_json (its error above): add it yourself, then restart dockerd" ;;
    esac
  fi
fi

# Emulation of the other architecture: qemu's handler registered with binfmt_misc, with the F
# flag (the interpreter is opened now, so it also works inside containers). Without systemd
# nothing registers it on install; `builder doctor` reports what is missing.
case "$(uname -m)" in
  x86_64) foreign=aarch64 ;;
  aarch64) foreign=x86_64 ;;
  *) foreign= ;;
esac
binfmt=/proc/sys/fs/binfmt_misc
if [ -n "$foreign" ] && [ ! -e "$binfmt/qemu-$foreign" ]; then
  if ! root; then
    say "no qemu-$foreign handler in binfmt_misc (foreign-platform builds fail); run: sudo $0"
  else
    [ -e "$binfmt/register" ] || mount -t binfmt_misc binfmt_misc "$binfmt" 2>/dev/null || true
    conf=/usr/lib/binfmt.d/qemu-$foreign.conf
    if [ -e "$binfmt/register" ] && [ -f "$conf" ] && grep -v '^#' "$conf" >"$binfmt/register" 2>/dev/null; then
      say "registered qemu-$foreign with binfmt_misc (foreign-platform builds run under emulation)"
    else
      say "could not register qemu-$foreign with binfmt_misc (is $binfmt mountable here?); foreign-platform builds will fail"
    fi
  fi
fi

# podman: no daemon to start (builder starts `podman system service` for its own run when no socket
# listens). Where root lacks CAP_SYS_RESOURCE (a container, a sandboxed VM), runc cannot raise a
# container's open-files and process limits to podman's defaults (1048576 and more) and every
# container fails ("error setting rlimit type 7"): the defaults become what this host allows.
podman_ready() {
  local caps conf=/etc/containers/containers.conf nofile nproc
  caps=$(awk '/^CapEff/ {print $2}' /proc/self/status)
  if root && ! (( (0x${caps:-0} >> 24) & 1 )) && ! grep -qs '^default_ulimits' "$conf"; then
    nofile=$(ulimit -Hn) nproc=$(ulimit -Hu)
    [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768  # conmon runs with at most 32768 here
    if [ -e "$conf" ]; then
      say "root lacks CAP_SYS_RESOURCE: add to [containers] in $conf: default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]"
      return 1
    fi
    mkdir -p /etc/containers
    printf '# Written by ml-image-builder scripts/setup-host.sh: root lacks CAP_SYS_RESOURCE here, so containers get\n# the limits this host allows instead of podman'"'"'s defaults (which runc cannot set).\n[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=%s:%s"]\n' \
      "$nofile" "$nofile" "$nproc" "$nproc" >"$conf"
    say "wrote $conf: containers' open files and processes capped at $nofile and $nproc (no CAP_SYS_RESOURCE here)"
  fi
  if ! root && ! grep -qs "^$(id -un):" /etc/subuid; then
    say "rootless podman needs subordinate IDs: sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 $(id -un)"
    return 1
  fi
  if ! podman info >/dev/null 2>&1; then
    say "podman info fails: $(podman info 2>&1 | tail -n 1)"
    return 1
  fi
  say "podman $(podman version --format '{{.Client.Version}}') is ready ($(root && echo rootful || echo rootless)); builds run with --engine podman or BUILDER_ENGINE=podman"
}
if [ "$ENGINE" = podman ]; then
  podman_ready
  exit $?
fi

log=/var/log/ml-image-builder-dockerd.log
if [ -n "$answering" ]; then
  if [ "$(major "$answering")" -ge "$MIN_ENGINE" ]; then
    if [ -n "$as_is" ] && ! docker buildx version >/dev/null 2>&1; then
      say "the engine that is there, $as_is, has no buildx (BuildKit's client): install Docker's docker-buildx-plugin"
      exit 1
    fi
    exit 0
  fi
  # The package was upgraded above (CI), but the old daemon still runs: restart it, if it is ours.
  if [ -n "$upgrade" ] && root; then
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ] && systemctl restart docker 2>/dev/null; then
      say "restarted the docker service on Docker $(dpkg-query -W -f='${Version}' docker.io)"
    elif pid=$(pidof dockerd); then
      say "CI: stopping the old dockerd $answering (pid $pid) to start the upgraded one"
      kill $pid
      for _ in $(seq 30); do pidof dockerd >/dev/null || break; sleep 1; done
    fi
  elif [ -z "${DOCKER_HOST:-}" ]; then
    say "the engine that answers is Docker $answering; this project needs Docker >= $MIN_ENGINE.0 (BuildKit, zstd, the containerd store)"
    if installed docker-ce; then
      say "  upgrade it with: sudo apt-get install --only-upgrade docker-ce docker-ce-cli containerd.io docker-buildx-plugin"
    fi
    exit 1
  fi
fi
if docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
  exit 0
fi
if [ -n "${DOCKER_HOST:-}" ]; then
  say "DOCKER_HOST=$DOCKER_HOST does not answer; start that engine or unset DOCKER_HOST"
  exit 1
fi
if ! root; then
  say "no Docker engine answers; run: sudo systemctl start docker (or sudo dockerd &), and add yourself to the docker group"
  exit 1
fi
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ] && systemctl start docker 2>/dev/null; then
  say "started the docker service (systemctl)"
else
  # setsid: the engine outlives this script and make, and a Ctrl-C in the terminal doesn't reach it.
  setsid dockerd >"$log" 2>&1 </dev/null &
  pid=$!
  say "no Docker engine answered: started dockerd (pid $pid, log $log); stop it with: kill $pid"
  if [ -n "${SETUP_HOST_PIDFILE:-}" ]; then echo "$pid" >"$SETUP_HOST_PIDFILE"; fi
fi
for _ in $(seq 60); do
  docker version --format '{{.Server.Version}}' >/dev/null 2>&1 && exit 0
  sleep 1
done
say "dockerd did not answer within 60 s; its log:"
tail -20 "$log" >&2 2>/dev/null || true
exit 1
