#!/usr/bin/env bash
# Build the kernel matrix's guest: a Debian 12 root filesystem (an ext4 image) with the kernels
# compute hosts run in the field, from Debian's own packages, and what yolofs' tests need inside
# it (FUSE, Python with pytest, QEMU for `yolofs pin`, an NFS server and client).
# tools/kernel-matrix/run boots it under QEMU with each kernel, the tests on a second disk.
#
# Kernels: Debian 12's stock one (linux-image-amd64: 6.1) and its 6.12 (linux-image-6.12.*+deb12,
# the series of Debian 13). Cached, rebuilt only when this script changes.
#
# Usage: tools/kernel-matrix/build-guest.sh    (prints the guest's directory)
#   YOLO_CACHE_DIR   where it is cached (default /var/cache/yolo)
#   DEBIAN_MIRROR    debootstrap mirror (default: the first deb.debian.org-style URI apt uses)
#   DEBIAN_SECURITY_MIRROR  its security suite's (default: debian-security beside it)
set -euo pipefail

cache_dir=${YOLO_CACHE_DIR:-/var/cache/yolo}
guest=$cache_dir/kernel-guest
here=$(cd "$(dirname "$0")" && pwd)
script_hash=$(sha256sum "$here/build-guest.sh" | cut -c1-16)
if [[ -f $guest/build-id && $(cat "$guest/build-id") == "$script_hash" ]]; then
    echo "$guest"
    exit 0
fi
[[ $EUID -eq 0 ]] || { echo "build-guest.sh: must run as root (debootstrap)" >&2; exit 1; }
# In a mount namespace of its own: its bind mounts of /dev, /proc and /sys, and their lazy
# unmounts, reach no other image build that runs meanwhile (tools/run-tests runs three), even
# where / is a shared mount.
if [[ -z ${YOLO_GUEST_BUILD_UNSHARED:-} ]]; then
    YOLO_GUEST_BUILD_UNSHARED=1 exec unshare --mount --propagation private "$0" "$@"
fi
for tool in debootstrap mkfs.ext4; do
    command -v "$tool" >/dev/null || { echo "build-guest.sh: missing $tool" >&2; exit 1; }
done
mirror=${DEBIAN_MIRROR:-}
if [[ -z $mirror ]]; then
    mirror=$(grep -rhoE 'https?://[^ ]+/debian/?$' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null | head -n1 || true)
    mirror=${mirror:-http://deb.debian.org/debian}
fi

work=$(mktemp -d "${TMPDIR:-/var/tmp}/yolo-kernel-guest.XXXXXX")
root=$work/root
cleanup() {
    set +e
    for m in dev/pts dev proc sys; do mountpoint -q "$root/$m" && umount -l "$root/$m"; done
    rm -rf "$work" "$guest.new"
}
trap cleanup EXIT

echo "==> debootstrap bookworm from $mirror" >&2
debootstrap --variant=minbase \
    --include=linux-image-amd64,kmod,fuse3,python3,python3-pytest,python3-prometheus-client,xfsprogs,e2fsprogs,iproute2,procps,qemu-system-x86,nfs-kernel-server \
    bookworm "$root" "$mirror" >&2
for m in proc sys dev dev/pts; do mount --bind "/$m" "$root/$m"; done
# Debian 12's kernels are updated through its security suite.
security=${DEBIAN_SECURITY_MIRROR:-${mirror%/debian*}/debian-security}
printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' \
    "$mirror" "$mirror" "$security" >"$root/etc/apt/sources.list"
chroot "$root" apt-get update -q >&2
# Debian 12's 6.12 (the series of Debian 13), a package of its own: the newest.
k612=$(chroot "$root" apt-cache search --names-only '^linux-image-6\.12\.[0-9]+\+deb12-amd64$' |
    awk '{print $1}' | sort -V | tail -n1)
[[ -n $k612 ]] || { echo "build-guest.sh: no linux-image-6.12.*+deb12-amd64 in bookworm" >&2; exit 1; }
# A small initramfs: what a virtio disk with ext4 on it needs.
sed -i 's/^MODULES=.*/MODULES=list/' "$root/etc/initramfs-tools/initramfs.conf"
printf '%s\n' virtio_pci virtio_blk ext4 >"$root/etc/initramfs-tools/modules"
DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -q --no-install-recommends \
    linux-image-amd64 "$k612" >&2
chroot "$root" update-initramfs -u -k all >&2
chroot "$root" apt-get clean
echo kernel-guest >"$root/etc/hostname"

# The guest's init: mounts the tests' disk, runs its script, then powers the guest off.
cat >"$root/sbin/kernel-matrix-init" <<'INIT'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm /matrix
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
ip link set lo up
mount -o ro /dev/vdb /matrix
sh /matrix/guest-run
echo "kernel-matrix: guest-run ended ($?)"
sync
echo o >/proc/sysrq-trigger
sleep 60
INIT
chmod 0755 "$root/sbin/kernel-matrix-init"

mkdir -p "$guest.new"
# The newest kernel of each series (debootstrap's 6.1 may have been updated since).
declare -A newest
while read -r release; do
    newest[$(cut -d. -f1,2 <<<"$release")]=$release
done < <(find "$root/boot" -name 'vmlinuz-*' -printf '%f\n' | sed 's/^vmlinuz-//' | sort -V)
for release in "${newest[@]}"; do
    cp "$root/boot/vmlinuz-$release" "$root/boot/initrd.img-$release" "$guest.new/"
done
for m in dev/pts dev proc sys; do umount -l "$root/$m"; done
rm -rf "${root:?}"/boot/* "${root:?}"/var/lib/apt/lists/*
# Room for the tests' files (pytest's temporary directories, base files).
size=$(( $(du -sm "$root" | cut -f1) + 3072 ))
# (Its "Creating regular file" line to stderr: stdout names the guest.)
mkfs.ext4 -q -L kernelguest -d "$root" "$guest.new/root.ext4" "${size}M" >&2
echo "$script_hash" >"$guest.new/build-id"
rm -rf "$guest"
mv "$guest.new" "$guest"
echo "$guest"
