"""``yolo-calibrate``: measure this host's boot-time parameters and save them for the driver.

Run on an idle compute node (as root: it drops the page cache and mounts yolofs)::

    yolo-calibrate --image debian12.qcow2 [--instances-path /var/lib/nova/instances]
                   [--boots 3] [--output /var/lib/yolo/calibration.json] [--accel kvm|tcg]

The image is converted to raw in a scratch directory on the instance storage (as Nova makes a
base file), a boot image is learned from one boot, then ``--boots`` normal and YOLO boots are
made alternately with a cold page cache. beta is the guest's vCPU running time up to ready in
the YOLO boots (the thesis took the CPU part from its logs), alpha the rest of a normal boot,
alpha_yolo the rest of a YOLO boot. The disk's capacity (random 4 KiB read IOPS at queue depth
32, sequential 1 MiB read bytes per second) is measured with fio unless given. Last, one normal
boot runs while fio reads at half the disk's IOPS: it measures k, the exponent of the model's I/O
part (1 for the thesis' HDD, near 0 for disks that share their rate without seeking).

The boots use the accelerator of the guests Nova starts on this host (``[libvirt] virt_type`` in
nova.conf: ``kvm`` or ``qemu``, that is TCG) unless ``--accel`` says otherwise: a TCG boot spends
many times a KVM boot's CPU time, so a KVM host's parameters must not come from TCG boots. The
accelerator is saved with the parameters, and the driver ignores a file made with another one.
"""

import argparse
import configparser
import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

from yolo_common import cli
from yolo_common import images
from yolo_common import learning
from yolo_common import qemu
from yolo_common import yolofs
from yolo_nova.model import calibration
from yolo_nova.model import estimators

DEFAULT_OUTPUT = '/var/lib/yolo/calibration.json'


def log(message):
    print('==> %s' % message, flush=True)


def novas_accel(nova_config):
    """The accelerator of the guests Nova starts, from its ``[libvirt] virt_type``; None if the
    file does not say (Nova's default, kvm, is not assumed: the operator is asked)."""
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.read(nova_config)
    virt_type = parser.get('libvirt', 'virt_type', fallback=None)
    return calibration.accel_of_virt_type(virt_type) if virt_type else None


def boot(disk, console_log, timeout, accel):
    """(boot seconds, vCPU running seconds at ready) of one cold boot of ``disk``."""
    with qemu.Guest(disk, console_log=console_log, accel=accel) as guest:
        seconds = guest.wait_ready(timeout)
        return round(seconds, 2), round(guest.vcpu_at_ready[0], 2)


def fio_capacity(directory, seconds=10):
    """(IOPS, bytes per second) of the disk holding ``directory``, reads with O_DIRECT."""
    path = os.path.join(directory, 'fio-calibrate.dat')
    results = []
    try:
        for rw, bs, depth in (('randread', '4k', 32), ('read', '1M', 8)):
            out = subprocess.run(
                ['fio', '--name=calibrate', '--filename=%s' % path, '--size=1G',
                 '--rw=%s' % rw, '--bs=%s' % bs, '--iodepth=%d' % depth, '--direct=1',
                 '--ioengine=libaio', '--time_based', '--runtime=%d' % seconds,
                 '--output-format=json'], check=True, capture_output=True, text=True).stdout
            job = json.loads(out)['jobs'][0]['read']
            results.append((job['iops'], job['bw_bytes']))
    finally:
        if os.path.exists(path):
            os.unlink(path)
    return round(results[0][0], 1), round(results[1][1], 1)


@contextlib.contextmanager
def half_load(directory, iops):
    """fio reading random 4 KiB blocks at half the disk's IOPS, for the duration."""
    path = os.path.join(directory, 'fio-load.dat')
    subprocess.run(['fio', '--name=prepare', '--filename=%s' % path, '--size=1G', '--rw=write',
                    '--bs=1M', '--direct=1'], check=True, capture_output=True)
    proc = subprocess.Popen(
        ['fio', '--name=load', '--filename=%s' % path, '--size=1G', '--rw=randread',
         '--bs=4k', '--iodepth=8', '--direct=1', '--ioengine=libaio',
         '--rate_iops=%d' % max(1, iops // 2), '--time_based', '--runtime=86400'],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(3)
        yield
    finally:
        proc.terminate()
        proc.wait(30)
        os.unlink(path)


def measure(image, scratch, boots, timeout, accel):
    """Learns the image's boot image, then ``boots`` normal and YOLO boots, alternately."""
    base_dir = scratch / '_base'
    base_dir.mkdir(parents=True)
    base = base_dir / images.base_file_name(str(uuid.uuid4()))
    log('converting %s to raw in %s' % (image, base_dir))
    images.convert_to_raw(image, base)
    log('learning its boot image from one boot')
    learned = learning.learn_boot_image(base, scratch / 'learn', boot_timeout=timeout,
                                        accel=accel)
    store = scratch / 'boot-images'
    store.mkdir()
    shutil.copy(learned.boot_image, store)
    shutil.copy(str(learned.boot_image) + '.verified', store)
    normal, yolo = [], []
    with yolofs.Mount(source=base_dir, mountpoint=scratch / 'mnt', boot_images=store,
                      control_socket=scratch / 'control.sock',
                      log_path=scratch / 'yolofs.log', mlock=True) as mount:
        for i in range(boots):
            for policy, backing, results in (('normal', base, normal),
                                             ('yolo', mount.mountpoint / base.name, yolo)):
                overlay = scratch / ('%s-%d.qcow2' % (policy, i))
                images.create_overlay(backing, overlay)
                qemu.drop_caches()
                if policy == 'yolo':
                    mount.client.evict(base.name)
                    mount.client.preload(base.name)
                results.append(boot(overlay, scratch / ('%s-%d.log' % (policy, i)), timeout,
                                    accel))
                overlay.unlink()
                log('%s boot %d: %.1f s, vCPU ran %.1f s' % (policy, i + 1, *results[-1]))
    return base, normal, yolo


def loaded_boot(base, scratch, iops, timeout, accel):
    """One cold normal boot while the disk serves half its IOPS to fio."""
    overlay = scratch / 'loaded.qcow2'
    images.create_overlay(base, overlay)
    qemu.drop_caches()
    with half_load(str(scratch), iops):
        seconds, _ = boot(overlay, scratch / 'loaded.log', timeout, accel)
    overlay.unlink()
    log('normal boot at half the disk\'s IOPS: %.1f s' % seconds)
    return seconds


def main(argv=None):
    parser = argparse.ArgumentParser(prog='yolo-calibrate', description=__doc__.split('\n')[0],
                                     formatter_class=cli.HelpFormatter)
    parser.add_argument('--image', required=True, type=cli.existing_file,
                        help='a bootable image (qcow2 or raw) that prints a ready marker on its '
                        'serial console')
    parser.add_argument('--instances-path', default='/var/lib/nova/instances',
                        help='scratch space is taken here, on the instance storage')
    parser.add_argument('--output', default=DEFAULT_OUTPUT,
                        help='where the calibration is saved, for the driver to report')
    parser.add_argument('--boots', type=int, default=3, help='boots per measurement')
    parser.add_argument('--boot-timeout', type=float, default=900,
                        help='seconds a boot may take to reach its ready marker')
    parser.add_argument('--disk-iops', type=float,
                        help='the disk\'s capacity in operations per second (else: fio)')
    parser.add_argument('--disk-bytes-per-second', type=float,
                        help='the disk\'s capacity in bytes per second (else: fio)')
    parser.add_argument('--io-exponent', type=float,
                        help='k of the I/O part (else: measured by a boot under load)')
    parser.add_argument('--accel', choices=('kvm', 'tcg'),
                        help='QEMU\'s accelerator for the boots (else: the one of Nova\'s '
                        '[libvirt] virt_type in --nova-config)')
    parser.add_argument('--nova-config', default='/etc/nova/nova.conf',
                        help='nova-compute\'s configuration, read for [libvirt] virt_type')
    args = parser.parse_args(argv)
    accel = args.accel or novas_accel(args.nova_config)
    if accel is None:
        parser.error('%s has no [libvirt] virt_type of kvm or qemu: say --accel kvm or tcg'
                     % args.nova_config)

    os.makedirs(args.instances_path, exist_ok=True)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix='yolo-calibrate-', dir=args.instances_path))
    try:
        if args.disk_iops is None or args.disk_bytes_per_second is None:
            log('measuring the disk with fio')
            iops, bps = fio_capacity(str(scratch))
        iops = args.disk_iops if args.disk_iops is not None else iops
        bps = args.disk_bytes_per_second if args.disk_bytes_per_second is not None else bps
        base, normal, yolo = measure(args.image, scratch, args.boots, args.boot_timeout, accel)
        result = estimators.from_boots(normal, yolo, cpus=os.cpu_count() or 1, disk_iops=iops,
                                       disk_bytes_per_second=bps, accel=accel)
        k = args.io_exponent
        if k is None:
            loaded = loaded_boot(base, scratch, int(iops), args.boot_timeout, accel)
            k = estimators.io_exponent_from(result.params, loaded, 0.5)
            result.details['loaded_boot'] = loaded
        result = dataclasses.replace(result, io_exponent=round(k, 3))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    calibration.save(result, args.output)
    log('alpha %.2f s, beta %.2f s, alpha_yolo %.2f s, k %.2f, %d CPUs, disk %.0f IOPS, '
        '%.0f MB/s, %s boots: saved in %s' % (
            result.alpha, result.beta, result.alpha_yolo, result.io_exponent, result.cpus,
            iops, bps / 1e6, accel, args.output))
    return 0


if __name__ == '__main__':
    sys.exit(main())
