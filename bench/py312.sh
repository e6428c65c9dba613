#!/usr/bin/env bash
# Ubuntu 24.04's Python 3.12 (the images' and the GPU box's), run in the current directory from
# the chroot that `.ci/py312` builds (as root; run that once first): `.ci/py312` runs the tests
# with it, and it is a Python for bench/ab.sh's OLD_PY / NEW_PY, to weigh one Python against
# another on one build. It mounts the directory (at the same path), /proc and /dev into the
# chroot where they are not yet, and leaves them mounted (unmount them before deleting the
# chroot: /dev is the machine's).
#   OLD_PY=/usr/bin/python3.11 NEW_PY=bench/py312.sh bash bench/ab.sh . .
# The chroot's environment is empty but for the offline switches and the caller's BATCHSERVE_*
# settings (bench/ab.sh's BATCHSERVE_GRPC_PORT=0).
set -euo pipefail
root=${PY312_ROOT:-/tmp/noble}
here=$(pwd)
[ -f "$root/opt/v/ready" ] || { echo "py312.sh: no chroot at $root: run .ci/py312 first" >&2; exit 1; }
mkdir -p "$root$here"
mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
mountpoint -q "$root/dev" || mount --bind /dev "$root/dev"
mountpoint -q "$root$here" || mount --bind "$here" "$root$here"
mapfile -t settings < <(env | grep '^BATCHSERVE_' || true)
# shellcheck disable=SC2016  # expanded by the chroot's shell
exec chroot "$root" /usr/bin/env -i PATH=/opt/v/bin:/usr/bin:/bin:/usr/sbin HOME=/root \
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "${settings[@]}" HERE="$here" \
  sh -c 'cd "$HERE" && exec python "$@"' py "$@"
