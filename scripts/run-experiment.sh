#!/usr/bin/env bash
# run-experiment.sh: the design notes' launcher, as a thin wrapper over `builder run`.
#
#   cd my-experiment && /path/to/ml-image-builder/scripts/run-experiment.sh [CMD ...]
#
# Runs CMD (default: python train.py --epochs 10) in the latest-<vendor> image of this host:
# the vendor comes from /opt/gpu-config/vendor when scripts/host-init.sh wrote it, else from
# the host's PCI devices. The current directory is mounted at /workspace, the container gets
# the vendor's device flags, WORLD_SIZE/RANK/..., and runs as you; the exit status is CMD's.
# Everything is `builder run`'s (see `builder run --help`); this script holds no logic.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
builder="$root/.venv/bin/builder"
[ -x "$builder" ] || builder=builder
if [ -z "${BUILDER_VENDOR:-}" ] && [ -r "${GPU_CONFIG_VENDOR_FILE:-/opt/gpu-config/vendor}" ]; then
  BUILDER_VENDOR="$(cat "${GPU_CONFIG_VENDOR_FILE:-/opt/gpu-config/vendor}")"
  export BUILDER_VENDOR
fi
if [ "$#" -eq 0 ]; then set -- python train.py --epochs 10; fi
exec "$builder" run --matrix "$root/matrix.yaml" -- "$@"
