#!/usr/bin/env bash
# host-init.sh: the design notes' host initialisation, as a thin wrapper over `builder doctor`.
#
#   sudo scripts/host-init.sh
#
# Checks this host (engine, GPUs and their container runtime or device nodes, groups, disk,
# registry) and prints the fix for each problem, then writes the vendor this host's images
# are chosen by (nvidia, amd, intel or cpu) to /opt/gpu-config/vendor, which
# scripts/run-experiment.sh reads. Installing drivers and container toolkits is left to the
# vendor's own packages: `builder doctor` names them. Exit status: doctor's (1 if an item fails).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
builder="$root/.venv/bin/builder"
[ -x "$builder" ] || builder=builder
exec "$builder" doctor --matrix "$root/matrix.yaml" --write-vendor "${GPU_CONFIG_VENDOR_FILE:-/opt/gpu-config/vendor}" "$@"
