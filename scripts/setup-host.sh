#!/usr/bin/env bash
# Make this host ready for `make images` and `make test`: the Debian packages they need, and a
# Docker engine that answers. Run by the Makefile before both commands and by .ci/run; safe to
# run again (it only acts on what is missing).
#
#   scripts/setup-host.sh            install what is missing (root: apt-get; else print the line)
#                                    and start dockerd when no engine answers (root only)
#   SETUP_HOST_PIDFILE=F ...         write the PID of a dockerd this script started to F
#
# Exit 0 when the host is ready, 1 with one line naming the fix when it is not.
set -euo pipefail

# Every Debian package a build or a test uses:
#   docker.io        the engine (Debian's 20.10 on bookworm) and its client
#   mmdebstrap       bootstraps the shared base image
#   arch-test        lets mmdebstrap bootstrap a foreign architecture's base (under qemu)
#   docker-registry  the local registry images are pushed to, and the tests' registries
#   busybox-static   the launcher tests' 2 MB stand-in image (a static binary)
#   qemu-user-static runs the other architecture's binaries (linux/arm64 on x86_64 and back),
#                    for builds and smoke tests of a foreign platform (binfmt_misc, below)
#   skopeo           reads the published image indexes back in the tests
#   slurm-wlm munge  a real Slurm cluster on loopback for the `builder slurm` tests (slurmctld, two
#                    slurmd, munged: started and stopped by the tests, never as services)
PACKAGES=(docker.io mmdebstrap arch-test docker-registry busybox-static qemu-user-static skopeo slurm-wlm munge)

say() { printf 'setup-host: %s\n' "$*" >&2; }

missing=()
for package in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'ok installed' || missing+=("$package")
done

if ((${#missing[@]})); then
  if [ "$(id -u)" != 0 ]; then
    say "missing Debian packages; run: sudo apt-get install -y --no-install-recommends ${missing[*]}"
    exit 1
  fi
  say "installing ${missing[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
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
  if [ "$(id -u)" != 0 ]; then
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

if docker info >/dev/null 2>&1 || docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
  exit 0
fi
if [ -n "${DOCKER_HOST:-}" ]; then
  say "DOCKER_HOST=$DOCKER_HOST does not answer; start that engine or unset DOCKER_HOST"
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  say "no Docker engine answers; run: sudo systemctl start docker (or sudo dockerd &), and add yourself to the docker group"
  exit 1
fi
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ] && systemctl start docker 2>/dev/null; then
  say "started the docker service (systemctl)"
else
  log=/var/log/ml-image-builder-dockerd.log
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
tail -20 /var/log/ml-image-builder-dockerd.log >&2 2>/dev/null || true
exit 1
