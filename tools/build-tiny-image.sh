#!/usr/bin/env bash
# Build a tiny BIOS-bootable VM image for the tests that check a Nova, Glance or driver path
# rather than the boot of a real distribution (as OpenStack's own CI boots CirrOS).
#
# The disk is laid out as the Debian test image (tools/build-test-image.sh) is: an MBR partition
# table, syslinux' MBR code, one ext4 partition and extlinux, so QEMU boots it from the disk
# (BIOS -> MBR -> extlinux -> kernel) and the boot's reads hit the disk image as YOLO expects.
# The partition holds Debian's own kernel, a busybox initramfs that loads the disk drivers and
# mounts the partition, and a root filesystem of busybox alone: its init mounts what it needs,
# starts busybox' acpid (ACPI's power button powers the guest off, as Nova's stop, shelve and
# resize ask) and prints the test images' ready line on the serial console with the boot's id.
# Under TCG it is ready in seconds where the Debian image takes a minute or more. It has no
# guest agent and no sshd: a test that runs commands in its guest uses the Debian image.
#
# Output: a compressed qcow2, cached and rebuilt only when this script changes.
#
# Usage: tools/build-tiny-image.sh [OUTPUT.qcow2]
#   YOLO_CACHE_DIR   where images are cached (default /var/cache/yolo)
#   IMAGE_SIZE       virtual disk size (default 2G, as the Debian image)
set -euo pipefail

YOLO_READY_MARKER="YOLO-GUEST-READY init-done"
cache_dir=${YOLO_CACHE_DIR:-/var/cache/yolo}
output=${1:-$cache_dir/images/tiny-yolo.qcow2}
image_size=${IMAGE_SIZE:-2G}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/disk-image.sh
source "$here/disk-image.sh"
image_cached "$here/build-tiny-image.sh"
image_requirements apt-get dpkg-deb depmod modprobe

mkdir -p "$(dirname "$output")"
image_workdir yolo-tiny-image

echo "==> Debian's kernel and busybox" >&2
# A machine whose package lists were never fetched (a fresh container) knows no package yet.
if ! apt-cache show busybox-static linux-image-amd64 >/dev/null 2>&1; then
    apt-get update -q >&2
fi
kernel_package=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')
[[ -n $kernel_package ]] || { echo "build-tiny-image.sh: no Debian kernel package found" >&2; exit 1; }
mkdir -p "$work/debs" "$work/kernel" "$work/busybox"
chown _apt "$work/debs" 2>/dev/null || true   # apt downloads as _apt where that user exists
(cd "$work/debs" && apt-get download -q "$kernel_package" busybox-static >&2)
dpkg-deb -x "$work/debs"/"$kernel_package"_*.deb "$work/kernel"
dpkg-deb -x "$work/debs"/busybox-static_*.deb "$work/busybox"
kver=$(ls "$work/kernel/lib/modules")
depmod -b "$work/kernel" "$kver"

# The modules a module needs, each once, in the order they load; not the CPU-specific variants
# of the CRC modules, which find no device under TCG (the generic ones do the work).
modules_for() {
    local module
    for module in "$@"; do
        modprobe -d "$work/kernel" -S "$kver" --show-depends "$module"
    done | awk '$1 == "insmod" && $2 !~ /\/arch\/x86\/crypto\// && !seen[$2]++ {print $2}'
}
copy_modules() {  # DESTDIR MODULE...: the files under DESTDIR/lib/modules, their order in .../load
    local dest=$1 module_path relative
    shift
    mkdir -p "$dest/lib/modules"
    : >"$dest/lib/modules/load"
    while read -r module_path; do
        relative=${module_path#"$work/kernel/lib/modules/$kver/"}
        install -D -m 644 "$module_path" "$dest/lib/modules/$relative"
        echo "/lib/modules/$relative" >>"$dest/lib/modules/load"
    done < <(modules_for "$@")
}

echo "==> busybox initramfs" >&2
initramfs="$work/initramfs"
mkdir -p "$initramfs"/{bin,dev,proc,sys,newroot}
install -m 755 "$work/busybox/bin/busybox" "$initramfs/bin/busybox"
# A virtio, virtio-scsi or IDE boot disk, as Nova's libvirt driver may give it.
copy_modules "$initramfs" virtio_pci virtio_blk virtio_scsi sd_mod ata_piix ata_generic ext4
cat >"$initramfs/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t devtmpfs devtmpfs /dev
mount -t proc proc /proc
mount -t sysfs sysfs /sys
while read -r module; do insmod "$module"; done </lib/modules/load
root=""
for _ in $(seq 100); do
    root=$(findfs LABEL=yolotiny 2>/dev/null) && break
    sleep 0.1
done
[ -n "$root" ] || { echo "tiny image: no partition labelled yolotiny" >/dev/console; poweroff -f; }
mount -t ext4 -o rw "$root" /newroot
mount --move /dev /newroot/dev
umount /proc /sys
exec switch_root /newroot /sbin/init
EOF
chmod 755 "$initramfs/init"
# busybox' own cpio: the host needs no cpio package. Everything here is root's.
(cd "$initramfs" && find . | sort | "$work/busybox/bin/busybox" cpio -o -H newc 2>/dev/null) | gzip -9 >"$work/initrd.img"

echo "==> root filesystem" >&2
loopdev=$(partitioned_disk "$raw" "$image_size")
# Inode tables and journal written now: the guest's kernel would otherwise zero them in the
# background after each boot, writes no boot of a cloud image makes.
mkfs.ext4 -q -L yolotiny -E lazy_itable_init=0,lazy_journal_init=0 "$loopdev"
mount "$loopdev" "$root"
mkdir -p "$root"/{bin,sbin,dev,proc,sys,tmp,run,root,boot/extlinux,etc/init.d,etc/acpi/PWRF}
install -m 755 "$work/busybox/bin/busybox" "$root/bin/busybox"
chroot "$root" /bin/busybox --install -s /bin
ln -s /bin/busybox "$root/sbin/init"
# ACPI's power button reaches acpid through the button driver's input device.
copy_modules "$root" button evdev
cat >"$root/etc/inittab" <<'EOF'
::sysinit:/etc/init.d/rcS
::shutdown:/bin/umount -a -r
EOF
cat >"$root/etc/init.d/rcS" <<EOF
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tmpfs tmpfs /run
while read -r module; do insmod "\$module"; done </lib/modules/load
acpid -l /run/acpid.log -p /run/acpid.pid
# A few lines of its own on the console, as a cloud image's boot prints (Tempest's console tests
# ask for 3 lines and more), then the ready line.
{
    echo "yolo-tiny: Linux \$(uname -r), \$(grep -c ^processor /proc/cpuinfo) CPU(s)"
    echo "yolo-tiny: memory \$(awk '/^MemTotal/ {print \$2, \$3}' /proc/meminfo)"
    echo "yolo-tiny: root \$(awk '\$2 == "/" {print \$1, \$3}' /proc/mounts)"
    echo "yolo-tiny: acpid powers off on the power button"
    echo "$YOLO_READY_MARKER boot \$(cat /proc/sys/kernel/random/boot_id)"
} >/dev/ttyS0
EOF
printf '#!/bin/sh\npoweroff\n' >"$root/etc/acpi/PWRF/00000080"
chmod 755 "$root/etc/init.d/rcS" "$root/etc/acpi/PWRF/00000080"
echo yolo-tiny >"$root/etc/hostname"

echo "==> installing extlinux" >&2
install -m 644 "$work/kernel/boot/vmlinuz-$kver" "$root/boot/vmlinuz"
install -m 644 "$work/initrd.img" "$root/boot/initrd.img"
cat >"$root/boot/extlinux/extlinux.conf" <<EOF
DEFAULT tiny
TIMEOUT 1
PROMPT 0
LABEL tiny
    LINUX /boot/vmlinuz
    INITRD /boot/initrd.img
    APPEND console=ttyS0,115200 quiet mitigations=off
EOF
extlinux --install "$root/boot/extlinux" >&2
release_disk
finish_image "$raw"
