#!/usr/bin/env bash
# Build a real, BIOS-bootable Debian 12 VM image for YOLO's tests and benchmarks.
#
# The disk has an MBR partition table, syslinux' MBR code, one ext4 partition holding a
# debootstrapped Debian 12 (kernel + initramfs, systemd, sshd) and extlinux as its boot loader,
# so QEMU boots it from the disk (BIOS -> MBR -> extlinux -> kernel -> root filesystem): the
# boot reads YOLO exists for all hit the disk image. A oneshot unit ordered after ssh.service
# prints YOLO_READY_MARKER on the serial console once sshd has started, with the boot's id: two
# boots of a quiet kernel can otherwise log the same bytes, and a test waiting for the next boot
# must tell them apart (tests/e2e wait_for_ready). qemu-guest-agent runs when
# the guest has its channel (libvirt's org.qemu.guest_agent.0; Nova adds it for images with
# hw_qemu_guest_agent=yes): tests and benchmarks run commands inside the guest with it (fio among
# them), for example to read every block of the disk once its guest has left the yolofs mount.
# acpid powers the guest off on ACPI's power button, as Nova's stop, shelve and resize ask
# (systemd-logind would, but it needs D-Bus); without it each of them waits out Nova's
# shutdown_timeout.
#
# Under TCG every instruction of the guest is emulated and a boot costs minutes of CPU on slower
# machines, so the image boots what a cloud image needs and nothing else: no network
# configuration (tests and benchmarks give guests no network), no getty, no systemd unit or
# generator that has nothing to do in a VM without D-Bus, encryption, EFI or binfmt, and no
# kernel module for hardware a test guest never uses.
#
# Output: a compressed qcow2 (what an operator would upload to Glance). It is cached and rebuilt
# only when this script changes.
#
# Variants whose boots read other files, for the boot storm benchmark's distinct images
# (docs/evaluation/benchmarks.md): YOLO_IMAGE_VARIANT=
#   standard      the image above (the default)
#   cloud-kernel  Debian's cloud kernel (linux-image-cloud-amd64) instead of the generic one
#   sysvinit      sysvinit instead of systemd, the ready line printed by /etc/rc.local
#   services      PostgreSQL and nginx started at boot, as an application image would
#   cloud-init    cloud-init (Python) run at boot with no datasource, as cloud images do
# each in debian12-yolo-VARIANT.qcow2. YOLO_DEBIAN_RELEASE=bullseye builds them from Debian 11
# instead (debian11-yolo[-VARIANT].qcow2): a second release, for the catalogue of variants.
#
# Usage: tools/build-test-image.sh [OUTPUT.qcow2]
#   YOLO_IMAGE_VARIANT  which image (default standard)
#   YOLO_DEBIAN_RELEASE bookworm (default) or bullseye
#   YOLO_CACHE_DIR   where images are cached (default /var/cache/yolo)
#   DEBIAN_MIRROR    debootstrap mirror (default: the first deb.debian.org-style URI apt uses)
#   IMAGE_SIZE       virtual disk size (default 2G)
set -euo pipefail

YOLO_READY_MARKER="YOLO-GUEST-READY sshd-started"
cache_dir=${YOLO_CACHE_DIR:-/var/cache/yolo}
variant=${YOLO_IMAGE_VARIANT:-standard}
release=${YOLO_DEBIAN_RELEASE:-bookworm}
case $release in
    bookworm) release_number=12 ;;
    bullseye) release_number=11 ;;
    *) echo "build-test-image.sh: no release $release" >&2; exit 2 ;;
esac
kernel_package=linux-image-amd64 init_package=systemd-sysv extra_packages=""
case $variant in
    standard) ;;
    cloud-kernel) kernel_package=linux-image-cloud-amd64 ;;
    sysvinit) init_package=sysvinit-core ;;
    services) extra_packages="postgresql nginx-light" ;;
    cloud-init) extra_packages=cloud-init ;;
    *) echo "build-test-image.sh: no variant $variant" >&2; exit 2 ;;
esac
default_output=$cache_dir/images/debian$release_number-yolo.qcow2
[[ $variant == standard ]] || default_output=$cache_dir/images/debian$release_number-yolo-$variant.qcow2
output=${1:-$default_output}
image_size=${IMAGE_SIZE:-2G}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tools/disk-image.sh
source "$here/disk-image.sh"
image_cached "$here/build-test-image.sh" "$variant${release#bookworm}"
image_requirements debootstrap

mirror=${DEBIAN_MIRROR:-}
if [[ -z $mirror ]]; then
    mirror=$(grep -rhoE 'https?://[^ ]+/debian/?$' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null | head -n1 || true)
    mirror=${mirror:-http://deb.debian.org/debian}
fi

mkdir -p "$(dirname "$output")"
image_workdir yolo-image

echo "==> partitioning a $image_size raw disk" >&2
loopdev=$(partitioned_disk "$raw" "$image_size")
mkfs.ext4 -q -L yoloroot "$loopdev"
root_uuid=$(blkid -s UUID -o value "$loopdev")
mount "$loopdev" "$root"

echo "==> debootstrap $release from $mirror" >&2
# apt in the image (the variants' packages) needs the CA certificates for an https mirror.
certificates=""
[[ -z $extra_packages || $mirror != https:* ]] || certificates=,ca-certificates
debootstrap --variant=minbase \
    --include=$kernel_package,$init_package,udev,openssh-server,acpid,iproute2,kmod,qemu-guest-agent,fio$certificates \
    "$release" "$root" "$mirror" >&2

bind_host_dirs
if [[ -n $extra_packages ]]; then
    # With apt rather than debootstrap, which cannot order their dependencies.
    # shellcheck disable=SC2086 # a list of packages
    install_packages $extra_packages
fi

cat >"$root/etc/fstab" <<EOF
UUID=$root_uuid / ext4 defaults,errors=remount-ro 0 1
EOF
echo yolo-guest >"$root/etc/hostname"
# Under TCG every instruction is emulated: a module the guest has no use for (no floppy, no
# mouse or USB, no nested guests, no encryption) costs seconds of its boot to load
# (the initramfs, made below, takes this list too).
printf 'blacklist %s\n' floppy pcspkr serio_raw psmouse joydev i2c_piix4 uhci_hcd ehci_hcd \
    kvm kvm_amd kvm_intel cryptd aesni_intel ghash_clmulni_intel polyval_clmulni crc32_pclmul \
    crct10dif_pclmul sha1_ssse3 sha256_ssse3 sha512_ssse3 >"$root/etc/modprobe.d/yolo-test-guest.conf"
# A small initramfs: only what a virtio or IDE boot disk needs (faster to read and unpack).
sed -i 's/^MODULES=.*/MODULES=list/' "$root/etc/initramfs-tools/initramfs.conf"
printf '%s\n' virtio_pci virtio_blk virtio_scsi sd_mod ata_piix ata_generic ext4 >"$root/etc/initramfs-tools/modules"
echo 'root:yolo' | chroot "$root" chpasswd
chroot "$root" update-initramfs -u -k all >&2

if [[ $init_package == systemd-sysv ]]; then
    # What the ready line waits for beyond sshd: the variant's own services (PostgreSQL's
    # cluster unit, whose generator is masked below, is started by this).
    ready_after=ssh.service
    [[ $variant == services ]] &&
        ready_after+=" postgresql@$(ls "$root/etc/postgresql")-main.service nginx.service"
    cat >"$root/etc/systemd/system/yolo-ready.service" <<EOF
[Unit]
Description=Report on the serial console that sshd has started
After=$ready_after
Wants=$ready_after

[Service]
Type=oneshot
ExecStart=/bin/sh -c 'echo "$YOLO_READY_MARKER boot \$\$(cat /proc/sys/kernel/random/boot_id)" > /dev/ttyS0'

[Install]
WantedBy=multi-user.target
EOF
    chroot "$root" systemctl enable yolo-ready.service ssh.service acpid.service >&2
    poweroff="/bin/systemctl poweroff"
    # sshd checks its configuration before each start (sshd -t); this one is Debian's own.
    mkdir -p "$root/etc/systemd/system/ssh.service.d"
    printf '[Service]\nExecStartPre=\n' >"$root/etc/systemd/system/ssh.service.d/yolo-test-guest.conf"
    chroot "$root" systemctl set-default multi-user.target >&2
    # Nothing but the boot path: no timers or periodic jobs that would add unrelated reads, and
    # no unit with nothing to do here (each costs seconds of emulated CPU).
    chroot "$root" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer \
        e2scrub_reap.service getty@tty1.service serial-getty@ttyS0.service getty-static.service \
        systemd-binfmt.service proc-sys-fs-binfmt_misc.automount proc-sys-fs-binfmt_misc.mount \
        dev-hugepages.mount dev-mqueue.mount sys-kernel-debug.mount sys-kernel-tracing.mount \
        sys-kernel-config.mount sys-fs-fuse-connections.mount kmod-static-nodes.service \
        modprobe@configfs.service modprobe@dm_mod.service modprobe@efi_pstore.service \
        modprobe@fuse.service modprobe@loop.service modprobe@drm.service systemd-pstore.service \
        systemd-sysusers.service systemd-random-seed.service systemd-journal-flush.service \
        systemd-update-utmp.service systemd-update-utmp-runlevel.service \
        systemd-modules-load.service >&2
    # systemd runs every generator at each start; only the fstab one has work in this guest
    # (cloud-init's would enable cloud-init.target: enabled below instead).
    mkdir -p "$root/etc/systemd/system-generators"
    for generator in "$root"/lib/systemd/system-generators/*; do
        [[ $(basename "$generator") == systemd-fstab-generator ]] ||
            ln -sf /dev/null "$root/etc/systemd/system-generators/$(basename "$generator")"
    done
else
    # sysvinit runs /etc/rc.local last, after sshd.
    cat >"$root/etc/rc.local" <<EOF
#!/bin/sh
echo "$YOLO_READY_MARKER boot \$(cat /proc/sys/kernel/random/boot_id)" > /dev/ttyS0
EOF
    chmod +x "$root/etc/rc.local"
    poweroff=/sbin/poweroff
    # No gettys: nobody logs in on a test guest's consoles.
    sed -i 's/^\([0-9]*:[0-9]*:respawn:.*getty.*\)/#\1/' "$root/etc/inittab"
fi
if [[ $variant == cloud-init ]]; then
    # No datasource to look for (the guests have no network) and no network to configure:
    # cloud-init's stages still run, as they run at a cloud image's first boot.
    printf 'datasource_list: [ None ]\nnetwork: {config: disabled}\n' \
        >"$root/etc/cloud/cloud.cfg.d/90-yolo-test-guest.cfg"
    ln -sf /lib/systemd/system/cloud-init.target "$root/etc/systemd/system/multi-user.target.wants/"
fi
cat >"$root/etc/acpi/events/yolo-power-button" <<EOF
event=button[ /]power
action=$poweroff
EOF
chroot "$root" apt-get clean

echo "==> installing extlinux" >&2
mkdir -p "$root/boot/extlinux"
newest() { printf '%s\n' "${@##*/}" | sort -V | tail -n1; }
kernel=$(newest "$root"/boot/vmlinuz-*)
initrd=$(newest "$root"/boot/initrd.img-*)
cat >"$root/boot/extlinux/extlinux.conf" <<EOF
DEFAULT debian
TIMEOUT 1
PROMPT 0
LABEL debian
    LINUX /boot/$kernel
    INITRD /boot/$initrd
    APPEND root=UUID=$root_uuid ro console=ttyS0,115200 quiet mitigations=off
EOF
extlinux --install "$root/boot/extlinux" >&2

release_disk
finish_image "$raw"
