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
#   SETUP_HOST_POLICY_RC=F ...       the policy-rc.d that keeps the install from starting services
#                                    (default /usr/sbin/policy-rc.d)
#   ENGINE=podman ...                the engine is podman (+ buildah): installed beside whatever is
#                                    there (Docker's packages stay), and no dockerd is started
#   CI=true ...                      also upgrade an engine older than 26 in place (CI machines are
#                                    reused); on a user's machine that is only ever printed
#
# What it changes, each said when done (docs/building.md#what-make-host-changes has how to undo each):
# Debian packages (apt-get install, never a removal); on Debian 12 Debian 13's suite and its pin
# (/etc/apt/sources.list.d/ml-image-builder-trixie.sources, /etc/apt/preferences.d/ml-image-builder-trixie);
# the services of packages it installed in this run, masked; /etc/docker/daemon.json of Debian's
# docker.io (the old file kept beside it); qemu's binfmt_misc handler; a dockerd it starts; with
# ENGINE=podman where root lacks CAP_SYS_RESOURCE, /etc/containers/containers.conf.
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
# Their services, by the package that ships each (slurm-wlm depends on slurmctld and slurmd): the
# tests start and stop them themselves, so an install neither starts nor enables them (quiet_services).
declare -A SERVICES=([docker-registry]=docker-registry [slurmctld]=slurmctld [slurmd]=slurmd [munge]=munge)
MIN_ENGINE=26

say() { printf 'setup-host: %s\n' "$*" >&2; }
root() { [ "$(id -u)" = 0 ]; }
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'ok installed'; }
major() { printf '%s' "${1%%.*}" | tr -cd 0-9; }
codename=$(. /etc/os-release 2>/dev/null && printf '%s' "${VERSION_CODENAME:-}")

TRIXIE_SOURCES=/etc/apt/sources.list.d/ml-image-builder-trixie.sources
TRIXIE_PIN=/etc/apt/preferences.d/ml-image-builder-trixie
PINNED="${ENGINE_PACKAGES[*]} ${TOOL_PACKAGES[*]}"
# Writes stdin to the file $1 whole or not at all: a hidden temp file beside it (apt skips dotfiles),
# flushed to disk, then renamed over it; mode 0644 (apt's tools read it as any user).
put() {
  local tmp
  tmp=$(mktemp -p "$(dirname "$1")" ".$(basename "$1").XXXXXX") || return 1
  if cat >"$tmp" && chmod 644 "$tmp" && sync "$tmp" && mv -f "$tmp" "$1"; then return 0; fi
  rm -f "$tmp"
  return 1
}
# Debian 12 only: Debian 13's suites at priority 1, the engine's packages and the tools at 500.
# apt_preferences(5): an installed version has 100, and a candidate below 100 never replaces it (at
# 100 it did whenever its version was higher: a backport, a package bookworm dropped or one installed
# by hand went to Debian 13's with the next apt-get upgrade); below 100 nothing is installed from
# the suite unless no other version exists or it is asked for (-t trixie). At 500 the named
# packages compete with bookworm's by version: the newer, Debian 13's, wins, security updates too.
trixie_pin() {
  cat <<EOF
# Added by ml-image-builder's scripts/setup-host.sh: $PINNED come from Debian 13
# (trixie, trixie-security); the rest of it at 1 never replaces a version installed here, nor is
# installed unless asked for (apt-get install -t trixie). Undo: remove this file and
# $TRIXIE_SOURCES.
Package: *
Pin: release n=trixie
Pin-Priority: 1

Package: *
Pin: release n=trixie-security
Pin-Priority: 1

Package: $PINNED
Pin: release n=trixie
Pin-Priority: 500

Package: $PINNED
Pin: release n=trixie-security
Pin-Priority: 500
EOF
}
trixie_sources() {
  cat <<EOF
# Added by ml-image-builder's scripts/setup-host.sh: Docker 26 and cosign/oras from Debian 13, with
# its security updates. The pin beside it ($TRIXIE_PIN) keeps the rest on bookworm.
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
}
# $1 = install: packages are installed now (root), and the suite is added where it is missing.
# Otherwise only the files a run (of this or an earlier version) left are brought up to date.
trixie_suite() {
  if [ -n "$codename" ] && [ "$codename" != bookworm ]; then
    # Upgraded from Debian 12 since: the pin would now hold back the host's own suite (trixie at 1).
    [ -e "$TRIXIE_PIN" ] || [ -e "$TRIXIE_SOURCES" ] || return 0
    if root; then
      rm -f "$TRIXIE_PIN" "$TRIXIE_SOURCES"
      say "removed $TRIXIE_PIN and $TRIXIE_SOURCES: they were for Debian 12, and this host is $codename now"
    else
      say "this host is $codename now: remove the Debian 12 pin (it holds back $codename): sudo rm -f $TRIXIE_PIN $TRIXIE_SOURCES"
    fi
    return 0
  fi
  [ "$codename" = bookworm ] || return 0
  if [ "${1:-}" = install ] && ! grep -qs trixie-security "$TRIXIE_SOURCES"; then
    say "Debian 12 ships Docker 20.10: adding Debian 13's suite and trixie-security to apt ($TRIXIE_SOURCES),"
    say "  pinned ($TRIXIE_PIN): only $PINNED come from them, the rest never replaces a package installed here"
    trixie_sources | put "$TRIXIE_SOURCES"
  elif [ ! -e "$TRIXIE_SOURCES" ] && [ ! -e "$TRIXIE_PIN" ]; then
    return 0
  fi
  [ "$(cat "$TRIXIE_PIN" 2>/dev/null)" != "$(trixie_pin)" ] || return 0
  if ! root; then
    say "$TRIXIE_PIN is an earlier setup-host's (Debian 13 at priority 100: apt-get upgrade can move a package"
    say "  installed here to Debian 13's); run: sudo $0 (it rewrites the pin: Debian 13 at 1)"
    return 0
  fi
  [ ! -e "$TRIXIE_PIN" ] ||
    say "lowered Debian 13's suites to priority 1 in $TRIXIE_PIN (at 100 apt-get upgrade could move a package installed here to Debian 13's); $PINNED stay at 500"
  trixie_pin | put "$TRIXIE_PIN"
}

# Where this run installs a package that ships one of SERVICES, that service is neither started nor
# enabled: for the install's time a policy-rc.d answers 101 (action forbidden) for it, which
# invoke-rc.d and deb-systemd-invoke obey, with or without systemd; where systemd runs it is masked
# after (no start at boot), and the script prints how to undo that. Only a service that no package
# and no unit provided before the run: one already there (slurmd on a compute node, a unit of your
# own) is neither refused nor masked. A policy-rc.d already there (containers have one) is the
# host's and stays as it is.
POLICY=${SETUP_HOST_POLICY_RC:-/usr/sbin/policy-rc.d}
policy_ours=
systemd() { command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; }
unit_known() { systemd && systemctl list-unit-files --no-legend --no-pager "$1.service" 2>/dev/null | grep -q "^$1\.service"; }
declare -A fresh=() # a package not installed before this run -> its services that no unit provided
quiet_services() {
  local package service services=()
  for package in "${!SERVICES[@]}"; do
    installed "$package" && continue
    for service in ${SERVICES[$package]}; do
      unit_known "$service" && continue
      fresh[$package]+="$service "
      services+=("$service")
    done
  done
  ((${#services[@]})) || return 0
  if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\n# Written by ml-image-builder scripts/setup-host.sh for its apt-get install; removed after it.\ncase "$1" in %s) exit 101 ;; esac\nexit 0\n' \
      "$(IFS='|'; printf '%s' "${services[*]}")" >"$POLICY"
    chmod 755 "$POLICY"
    policy_ours=1
  fi
}
# After the install: the services of the packages it installed are masked (systemd), or said to be stopped.
mask_installed() {
  local package units=()
  for package in "${!fresh[@]}"; do
    # shellcheck disable=SC2206 # a package's services: words
    installed "$package" && units+=(${fresh[$package]})
  done
  ((${#units[@]})) || return 0
  if systemd; then
    systemctl mask --quiet "${units[@]/%/.service}" || true
    say "masked ${units[*]}, installed now (the tests start them themselves); undo: systemctl unmask ${units[*]/%/.service}"
  else
    say "the install does not start ${units[*]}: the tests start them themselves"
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

if ((${#missing[@]})) && root; then trixie_suite install; else trixie_suite; fi
new_engine=
if ((${#missing[@]})); then
  if ! root; then
    [ "$codename" = bookworm ] && [ ! -f "$TRIXIE_PIN" ] && say "run 'sudo $0' (it adds Debian 13's suite for Docker 26, pinned)"
    say "missing Debian packages; run: sudo apt-get install -y --no-install-recommends ${missing[*]}"
    exit 1
  fi
  quiet_services
  say "installing ${missing[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # --no-remove: an install that needs a package removed (a conflict) stops here; nothing is removed.
  apt_out=$(mktemp)
  if ! apt-get install -y -qq --no-install-recommends --no-remove -o Dpkg::Options::=--force-confold \
    "${missing[@]}" >"$apt_out" 2>&1; then
    tail -n 25 "$apt_out" >&2
    rm -f "$apt_out"
    mask_installed
    say "apt-get cannot install ${missing[*]} without removing a package (its output above); nothing was removed: resolve that, then run $0 again"
    exit 1
  fi
  rm -f "$apt_out"
  mask_installed
  [[ " ${missing[*]} " == *" docker.io "* ]] && new_engine=1
fi

# /etc/docker/daemon.json. What this script sets there:
# - a new install gets the containerd image store, as Engine 29 and Docker Desktop do for new
#   installs, and a bound on BuildKit's cache: 30GB holds two full sets of cpu + nvidia-cu130 (layers
#   and wheel copies, ~13 GB a set, estimated): today's and the one before a relock; older records go
#   first (docs/commands.md#what-the-builder-keeps). The file an earlier version wrote before it set
#   the bound (byte for byte) gets the bound. Any other daemon.json keeps its store (switching stores
#   hides images) and its cache: the line to add is printed.
# - CDI device names (--device vendor.com/gpu=all: builder run and the Slurm script use them where the
#   host has a CDI spec): Docker reads CDI specs only with "features": {"cdi": true}, until 28.2 turned
#   it on by default. Below 28.2 it is merged in (every other key stays, a "cdi" already there too).
# Only for the engine this script installs (Debian's docker.io) and as root: another engine's file
# (Docker CE, Moby, Desktop) is that engine's, and gets the lines to add printed instead. An edit is
# one rename (merge_daemon_json), and the file it replaces is kept beside it.
daemon_json=/etc/docker/daemon.json
gc_policy='"builder": {"gc": {"enabled": true, "defaultKeepStorage": "30GB"}}'
cdi_line='"features": {"cdi": true}'
ours_before=$'{\n  "features": {"containerd-snapshotter": true}\n}'
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
# Sets each KEY=JSON (a dotted path) the daemon.json $1 lacks, keeping every other key and value:
# the new text goes to a temp file beside it (flushed), the old file is kept as
# $1.ml-image-builder-<UTC time>.bak (a hard link), and the temp file is renamed over $1: a reader
# (dockerd) sees the old file or the new one, whole. Prints "set KEY" for each key set and "kept
# BACKUP"; nothing when it lacks none. Exit 4 with the reason on stdout where $1 is no JSON object
# (then nothing is written).
merge_daemon_json() {
  python3 - "$@" <<'PY'
import json
import os
import shutil
import sys
import tempfile
import time

path, edits = sys.argv[1], sys.argv[2:]
path = os.path.realpath(path)  # a link stays a link: the file it names is edited
try:
    with open(path, "rb") as handle:
        old = handle.read()
except FileNotFoundError:
    old = None
try:
    conf = json.loads(old) if old and old.strip() else {}
except ValueError as err:
    print(f"is not valid JSON ({err})")
    sys.exit(4)
if not isinstance(conf, dict):
    print("is not a JSON object")
    sys.exit(4)
done = []
for edit in edits:
    key, _, value = edit.partition("=")
    *parents, leaf = key.split(".")
    node = conf
    for name in parents:
        node = node.setdefault(name, {})
        if not isinstance(node, dict):
            print(f'is not what Docker reads: its "{name}" is not a JSON object')
            sys.exit(4)
    if leaf not in node:
        node[leaf] = json.loads(value)
        done.append(f"set {key}")
if not done:
    sys.exit(0)
folder = os.path.dirname(path)
os.makedirs(folder, exist_ok=True)
handle, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.")
try:
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(json.dumps(conf, indent=2) + "\n")
        out.flush()
        os.fsync(out.fileno())
    if old is None:
        os.chmod(tmp, 0o644)
    else:
        state = os.stat(path)
        os.chmod(tmp, state.st_mode & 0o7777)
        os.chown(tmp, state.st_uid, state.st_gid)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        backup, n = f"{path}.ml-image-builder-{stamp}.bak", 1
        while os.path.lexists(backup):
            n += 1
            backup = f"{path}.ml-image-builder-{stamp}-{n}.bak"
        try:
            os.link(path, backup)
        except OSError:
            shutil.copy2(path, backup)
        done.append(f"kept {backup}")
    os.replace(tmp, path)
except BaseException:
    os.unlink(tmp)
    raise
folder_fd = os.open(folder, os.O_RDONLY)
try:
    os.fsync(folder_fd)
finally:
    os.close(folder_fd)
print("\n".join(done))
PY
}
edits=()
if [ -n "$new_engine" ] && [ ! -s "$daemon_json" ]; then
  edits+=('features.containerd-snapshotter=true' 'builder.gc={"enabled": true, "defaultKeepStorage": "30GB"}')
elif [ "$(cat "$daemon_json" 2>/dev/null)" = "$ours_before" ]; then
  edits+=('builder.gc={"enabled": true, "defaultKeepStorage": "30GB"}')
fi
cdi=
if [ -n "$engine_version" ] && ! cdi_by_default "$engine_version" && ! grep -qs '"cdi"' "$daemon_json"; then
  cdi="Docker $engine_version reads CDI specs only with $cdi_line in $daemon_json"
  edits+=('features.cdi=true')
fi
if [ -n "$as_is" ] || ! installed docker.io || ! root || ! command -v python3 >/dev/null 2>&1; then
  edits=() # printed, not made
  if [ -n "$as_is" ] || ! installed docker.io; then
    mine="setup-host edits only the daemon.json of Debian's docker.io"
  else
    mine="sudo $0 does"
  fi
  [ -z "$cdi" ] || say "$cdi: add it ($mine), then restart dockerd"
fi
merged=0
if ((${#edits[@]})); then
  merge_out=$(merge_daemon_json "$daemon_json" "${edits[@]}") || merged=$?
  case $merged in
    0)
      if [[ $merge_out == *"set features.containerd-snapshotter"* ]]; then
        say "wrote $daemon_json: the containerd image store (Engine 29's default for new installs), BuildKit's cache kept under 30GB"
      elif [[ $merge_out == *"set builder.gc"* ]]; then
        say "added BuildKit's 30GB bound to $daemon_json (an earlier setup-host wrote it; the image store is unchanged)"
      fi
      [[ $merge_out != *"set features.cdi"* ]] ||
        say "turned on Docker's CDI ($cdi_line) in $daemon_json: CDI device names work from dockerd's next start"
      if [[ $merge_out == *"kept "* ]]; then
        backup=${merge_out##*kept }
        say "  the file before is kept as $backup (undo: mv $backup ${backup%.ml-image-builder-*}, then restart dockerd)"
      fi
      ;;
    4) say "$daemon_json $merge_out: fix it (dockerd does not start with it), then run $0 again; it was not changed" ;;
    *) say "python3 could not edit $daemon_json (its error above); it was not changed${cdi:+: $cdi, add it yourself}" ;;
  esac
fi
if [ "$merged" != 4 ] && [ -s "$daemon_json" ] && ! grep -q '"defaultKeepStorage"' "$daemon_json"; then
  say "BuildKit's cache is unbounded here: add $gc_policy to $daemon_json, then restart dockerd"
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
