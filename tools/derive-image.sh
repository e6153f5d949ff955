#!/usr/bin/env bash
# Derive an image from a test image as users customise theirs (virt-customize, a Dockerfile's
# RUN lines): install packages into a copy of its file system with apt, and optionally run a
# command in it, leaving every block the change does not touch where it was. For the catalogue
# of image variants (docs/evaluation/benchmarks.md, "Cross-image sharing"), whose derived images
# share most of their bytes, at the same offsets, with the image they came from.
#
# The image's services are enabled by their packages and start at its boot, not here.
#
# Usage: tools/derive-image.sh BASE.qcow2 OUTPUT.qcow2 [PACKAGE...]
#   YOLO_DERIVE_COMMAND  a shell command run in the image's root after the packages (optional)
set -euo pipefail

[[ $# -ge 2 ]] || { sed -n 's/^# Usage: //p' "$0" >&2; exit 2; }
base=$1 output=$2
shift 2
[[ $EUID -eq 0 ]] || { echo "derive-image.sh: must run as root (loop devices)" >&2; exit 1; }

# shellcheck source=tools/disk-image.sh
source "$(dirname "$0")/disk-image.sh"
image_workdir yolo-derive

qemu-img convert -O raw "$base" "$raw"
loopdev=$(partition_loop "$raw")
mount "$loopdev" "$root"
bind_host_dirs

if [[ $# -gt 0 ]]; then
    echo "==> installing $*" >&2
    install_packages "$@"
    chroot "$root" apt-get clean
fi
if [[ -n ${YOLO_DERIVE_COMMAND:-} ]]; then
    echo "==> running $YOLO_DERIVE_COMMAND" >&2
    chroot "$root" /bin/sh -ec "$YOLO_DERIVE_COMMAND" >&2
fi

release_disk
mkdir -p "$(dirname "$output")"
qemu-img convert -c -O qcow2 "$raw" "$output.tmp"
mv "$output.tmp" "$output"
echo "$output"
