# shellcheck shell=bash
# What the test images' builders share (tools/build-test-image.sh, tools/build-tiny-image.sh):
# their cache, their tools, their work directory and a BIOS-bootable disk of one partition; each
# sets `output`, the qcow2 it makes. tools/derive-image.sh, which changes such a disk, takes the
# work directory, the partition's loop device and the package installs.

MBR_CODE=/usr/lib/syslinux/mbr/mbr.bin

image_cached() {  # BUILDER [VARIANT]: prints $output and exits if BUILDER and this file, as they
    # are, made it (of VARIANT)
    build_id=$({ cat "$1" "${BASH_SOURCE[0]}"; [[ -z ${2:-} ]] || echo "$2"; } | sha256sum | cut -c1-16)
    if [[ -f $output && -f $output.build-id && $(cat "$output.build-id") == "$build_id" ]]; then
        echo "$output"
        exit 0
    fi
}

image_requirements() {  # TOOL...: root, these tools, the disk tools and syslinux' MBR code
    local builder tool
    builder=$(basename "$0")
    [[ $EUID -eq 0 ]] || { echo "$builder: must run as root (loop devices)" >&2; exit 1; }
    for tool in "$@" extlinux qemu-img parted losetup mkfs.ext4; do
        command -v "$tool" >/dev/null || { echo "$builder: missing $tool" >&2; exit 1; }
    done
    [[ -f $MBR_CODE ]] || { echo "$builder: missing $MBR_CODE (syslinux-common)" >&2; exit 1; }
}

image_workdir() {  # NAME: $work, a new directory, with the paths of the raw disk ($raw) and of
    # its mounted partition ($root) in it; at exit, whatever is still mounted or attached there
    # is let go and the directory removed
    work=$(mktemp -d "${TMPDIR:-/var/tmp}/$1.XXXXXX")
    raw="$work/disk.raw" root="$work/root" loopdev=""
    mkdir -p "$root"
    # Never through a mount that could not be let go (the image's files, or the host's /dev).
    trap 'set +e; release_disk; rm -rf --one-file-system "$work"' EXIT
}

partition_loop() {  # RAW: attaches the partition of a disk made by partitioned_disk; prints its
    # loop device
    local start=$((1024 * 1024))
    # Loop devices here get no partition nodes: attach the partition by its offset.
    losetup --find --show --offset "$start" --sizelimit "$(($(stat -c %s "$1") - start))" "$1"
}

partitioned_disk() {  # RAW SIZE: an MBR disk, one bootable partition; prints its loop device
    # Chained: called in $(...), where set -e does not hold.
    truncate -s "$2" "$1" &&
        parted -s "$1" mklabel msdos mkpart primary ext4 1MiB 100% set 1 boot on &&
        dd if="$MBR_CODE" of="$1" bs=440 count=1 conv=notrunc status=none &&
        partition_loop "$1"
}

bind_host_dirs() {  # binds the host's /proc, /sys and /dev in $root, for chroot (release_disk
    # lets them go)
    local m
    for m in proc sys dev dev/pts; do mount --bind "/$m" "$root/$m"; done
}

install_packages() {  # PACKAGE...: installs them in $root with apt; the services they enable
    # start at the guest's boot, not here (policy-rc.d)
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
    chmod +x "$root/usr/sbin/policy-rc.d"
    chroot "$root" apt-get update >&2
    DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y --no-install-recommends "$@" >&2
    rm "$root/usr/sbin/policy-rc.d"
    rm -rf "$root"/var/lib/apt/lists/*
}

release_disk() {  # unmounts $root and what is bound in it, and detaches $loopdev
    local m
    for m in dev/pts dev proc sys; do
        if mountpoint -q "$root/$m"; then umount -l "$root/$m"; fi
    done
    if mountpoint -q "$root"; then umount "$root"; fi
    if [[ -n $loopdev ]]; then losetup -d "$loopdev"; fi
    loopdev=""
}

finish_image() {  # RAW: $output, a compressed qcow2 of RAW, with its build id; prints its path
    echo "==> converting to qcow2" >&2
    qemu-img convert -c -O qcow2 "$1" "$output.tmp"
    mv "$output.tmp" "$output"
    echo "$build_id" >"$output.build-id"
    echo "$output"
}
