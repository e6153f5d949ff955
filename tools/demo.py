"""YOLO's main job, end to end on one machine.

Builds (or reuses) the bootable test image, stores it as Nova would (``_base/<sha1(image id)>``,
raw), learns its boot image from one real QEMU boot through a learning yolofs mount, then boots it
normally (backing file in ``_base``) and through yolofs (backing file on the mount, boot image
preloaded), each from a cold page cache, and prints both boot times.

Usage: python3 tools/demo.py [--workdir DIR] [--runs N]
"""

import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import time
import uuid

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from yolo_common import images  # noqa: E402
from yolo_common import learning  # noqa: E402
from yolo_common import qemu  # noqa: E402
from yolo_common import yolofs  # noqa: E402


def log(message):
    print('==> ' + message, flush=True)


def boot(backing, overlay, console_log):
    images.create_overlay(backing, overlay)
    try:
        return qemu.boot(overlay, timeout=900, console_log=console_log)
    finally:
        overlay.unlink()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--workdir', default='/var/tmp/yolo-demo', type=pathlib.Path)
    parser.add_argument('--runs', type=int, default=1, help='cold boots per policy')
    args = parser.parse_args()

    work = args.workdir
    if work.exists():
        subprocess.run(['fusermount3', '-uz', str(work / 'mnt')], capture_output=True)
        shutil.rmtree(work)
    base_dir = work / 'instances' / '_base'
    base_dir.mkdir(parents=True)

    log('the test image (tools/build-test-image.sh builds it once, about 5 minutes, then '
        'reuses it)')
    # Its progress lines and, if it fails, its cause go to the terminal.
    build = subprocess.run([str(REPO / 'tools' / 'build-test-image.sh')], stdout=subprocess.PIPE,
                           text=True)
    if build.returncode != 0:
        sys.exit('demo: building the test image failed (exit %d): see its messages above'
                 % build.returncode)
    image = build.stdout.split()[-1]
    image_id = str(uuid.uuid4())
    base = base_dir / images.base_file_name(image_id)
    started = time.monotonic()
    images.convert_to_raw(image, base)
    log('image %s (%d bytes qcow2) -> raw base %s (%d bytes) in %.1fs' % (
        image, pathlib.Path(image).stat().st_size, base, base.stat().st_size,
        time.monotonic() - started))

    log('learning the boot image from one boot through a learning yolofs mount')
    learned = learning.learn_boot_image(base, work, console_log=work / 'console-learn.log')
    info = json.loads(yolofs.run('inspect', '--json', learned.boot_image).stdout)
    reads = sum(1 for line in learned.trace.read_text().splitlines() if not line.startswith('#'))
    log('boot image: %d reads -> %d extents, %.1f MiB (%.2f%% of the image), learned in %.1fs '
        '(boot %.1fs)' % (reads, info['extent_count'], info['covered_bytes'] / 2**20,
                          100 * info['coverage'], learned.boot_seconds + learned.build_seconds,
                          learned.boot_seconds))

    mount_args = dict(source=base_dir, mountpoint=work / 'mnt',
                      boot_images=learned.boot_image.parent, control_socket=work / 'control.sock')
    normal, yolo = [], []
    with yolofs.Mount(log_path=work / 'yolofs.log', mlock=True, **mount_args) as mount:
        for run in range(args.runs):
            qemu.drop_caches()
            normal.append(boot(base, work / 'normal.qcow2', work / 'console-normal.log'))
            log('run %d: normal boot (backing file in _base): %.2fs' % (run + 1, normal[-1]))
            qemu.drop_caches()
            mount.client.evict(base.name)
            mount.client.preload(base.name)
            yolo.append(boot(mount.mountpoint / base.name, work / 'yolo.qcow2',
                             work / 'console-yolo.log'))
            log('run %d: YOLO boot (backing file on yolofs): %.2fs' % (run + 1, yolo[-1]))
        stats = mount.client.stats(base.name)[base.name]

    served = stats['bytes_memory'] + stats['bytes_passthrough']
    print()
    print('boot time, cold page cache, median of %d:' % args.runs)
    print('  normal  %7.2f s' % statistics.median(normal))
    print('  YOLO    %7.2f s   (normal / YOLO = %.2f)' % (
        statistics.median(yolo), statistics.median(normal) / statistics.median(yolo)))
    print('YOLO boots read %.1f MiB through yolofs, %.1f%% from the boot image' % (
        served / 2**20, 100 * stats['bytes_memory'] / max(served, 1)))


if __name__ == '__main__':
    main()
