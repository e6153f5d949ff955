#!/usr/bin/env bash
# Install everything YOLO's build, tests and demo need on a Debian 12 machine (run as root).
# Idempotent: packages already present are kept, the venv is reused.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

debian_packages=(
    qemu-system-x86 qemu-utils          # real boots (TCG) and Nova's disk handling
    fuse3                               # fusermount3, used by yolofs to mount
    bubblewrap                          # the worker's profiling sandbox
    debootstrap extlinux syslinux-common parted e2fsprogs  # the bootable test images
    fio vmtouch iproute2                # benchmarks (tc: the rate of the link to Glance)
    libvirt-daemon-system libvirt-daemon-driver-qemu libvirt-clients libvirt-dev  # driver tests
    pkg-config python3-venv shellcheck
    build-essential python3-dev         # Python packages built from source (libvirt-python)
    kmod                                # modprobe fuse where /dev/fuse is missing
)
missing=()
for pkg in "${debian_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    echo "==> installing Debian packages: ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# yolofs needs Rust >= 1.85 (fuser 0.18). Debian 12's own cargo is too old; rustup's is expected.
source "$repo/tools/env.sh"
command -v cargo >/dev/null || { echo "install-deps: cargo not found (Rust >= 1.85 is required)" >&2; exit 1; }
rust_minor=$(rustc --version | sed -E 's/^rustc 1\.([0-9]+).*/\1/')
if ((rust_minor < 85)); then
    echo "install-deps: $(rustc --version) is too old; yolofs needs Rust >= 1.85" >&2
    exit 1
fi

[[ -e /dev/fuse ]] || modprobe fuse
# udev's rule for /dev/kvm where udev does not run (guests run under TCG: tools/aio/lib.sh says
# why libvirt needs it all the same).
if [[ -c /dev/kvm ]] && getent group kvm >/dev/null; then
    chgrp kvm /dev/kvm && chmod 0660 /dev/kvm
fi

if [[ ! -x $repo/.venv/bin/python ]]; then
    echo "==> creating the Python venv in .venv"
    python3 -m venv "$repo/.venv"
fi
echo "==> Python packages into .venv (Nova, Glance and their test fixtures: several minutes the first time)"
"$repo/.venv/bin/pip" install -q -r "$repo/test-requirements.txt"
# The project itself (console scripts, the nova.virt.yolo driver module); tests import the
# checkout's packages first (pytest.ini), this is what makes Nova find the driver.
"$repo/.venv/bin/pip" install -q --no-deps "$repo"
# The benchmarks and what they share with the tests (bench/README.md): their console script.
"$repo/.venv/bin/pip" install -q --no-deps -e "$repo/testing" -e "$repo/bench"
