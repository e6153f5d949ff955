"""How long a detach holds a running guest's disk: the pivots of the Nova driver's block copies.

One guest boots under libvirt (as Nova starts it: a persistent domain, qcow2 overlay with
``cache=none``) from the test image over a yolofs mount. Once it is ready, its disk is moved
back and forth between the mount and ``_base`` with the driver's own code
(``yolo_nova.virt.detach.move_backing``: two shallow block copies, each ending with a pivot),
CYCLES times each way, the guest running throughout. Reported: the duration of each pivot call
(libvirt's ``blockJobAbort(PIVOT)``, which returns once QEMU has drained the disk's I/O, switched
nodes and libvirt has updated its XML: an upper bound of the pause the guest's disk sees) and of a
whole move, median and max; and whether the guest's console shows an I/O error.

Usage (as root, libvirtd running): python3 tools/bench/detach_bench.py [--cycles N]
"""

import argparse
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault('OS_NOVA_DISABLE_EVENTLET_PATCHING', '1')

import libvirt  # noqa: E402
from nova.virt.libvirt import guest as libvirt_guest  # noqa: E402

from yolo_common import images  # noqa: E402
from yolo_common import qemu  # noqa: E402
from yolo_common import yolofs  # noqa: E402
from yolo_nova.virt import detach  # noqa: E402

GUEST_IO_ERROR = (b'I/O error', b'blk_update_request', b'EXT4-fs error')


def test_image():
    built = subprocess.run([str(REPO / 'tools' / 'build-test-image.sh')], check=True,
                           capture_output=True, text=True)
    return built.stdout.strip().splitlines()[-1]


def summary(seconds):
    ms = [s * 1e3 for s in seconds]
    return '%.1f ms median, %.1f ms max (n=%d)' % (statistics.median(ms), max(ms), len(ms))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--cycles', type=int, default=10,
                        help='moves each way (2 pivots per move)')
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix='yolo-detach-bench-', dir='/var/tmp'))
    work.chmod(0o755)
    conn = libvirt.open('qemu:///system')
    domain = None
    mount = None
    try:
        base_dir = work / '_base'
        base_dir.mkdir()
        base = base_dir / images.base_file_name(str(uuid.uuid4()))
        images.convert_to_raw(test_image(), base)
        mount = yolofs.Mount(base_dir, work / 'yolofs', work / 'boot-images',
                             work / 'control.sock', log_path=work / 'yolofs.log')
        mount.start()
        instance = work / 'instance'
        instance.mkdir()
        disk = instance / 'disk'
        images.create_overlay(mount.mountpoint / base.name, disk, size=4 << 30)
        console = work / 'console.log'
        domain = conn.defineXML(qemu.libvirt_domain_xml('yolo-detach-bench', disk, console))
        domain.create()
        guest = libvirt_guest.Guest(domain)
        deadline = time.monotonic() + 900
        while qemu.READY_MARKER not in (console.read_bytes() if console.exists() else b''):
            if time.monotonic() > deadline:
                sys.exit('the guest did not boot')
            time.sleep(1)
        pivots, moves = {'to _base': [], 'to the mount': []}, {'to _base': [], 'to the mount': []}
        for _ in range(args.cycles):
            for way, target in (('to _base', base), ('to the mount', mount.mountpoint / base.name)):
                started = time.monotonic()
                pivots[way] += detach.move_backing(guest, 'vda', str(disk), str(target))
                moves[way].append(time.monotonic() - started)
        errors = [e.decode() for e in GUEST_IO_ERROR if e in console.read_bytes()]
        print('# Detach: %d moves each way of a running guest (TCG, cache=none)\n' % args.cycles)
        print('| move | pivot (each move pivots twice) | whole move |')
        print('|---|---|---|')
        for way in pivots:
            print('| %s | %s | %s |' % (way, summary(pivots[way]), summary(moves[way])))
        print('\nguest I/O errors on its console: %s' % (', '.join(errors) or 'none'))
        print('overlay at the end: %d MiB allocated' % (disk.stat().st_blocks * 512 >> 20))
    finally:
        if domain is not None:
            domain.destroy()
            domain.undefine()
        if mount is not None:
            mount.stop()
        shutil.rmtree(work)


if __name__ == '__main__':
    main()
