"""What a detach costs a running guest, and what it gains it afterwards.

Three guests boot under libvirt (as Nova starts them: persistent domains, qcow2 overlays with
``cache=none``, TCG) from the test image, one at a time:

* ``never on yolofs``: its overlay is backed by the base file in ``_base``;
* ``on the mount``: backed by the base file on a yolofs mount, and left there;
* ``detached``: backed by the mount, then moved to ``_base`` once ready with the Nova driver's own
  code (``yolo_nova.virt.detach.move_backing``: two shallow block copies, each ending with a pivot).

The pause: the ``detached`` guest is moved back and forth between the mount and ``_base``
CYCLES times each way; reported is each pivot call (libvirt's ``blockJobAbort(PIVOT)``, which
returns once QEMU has drained the disk's I/O, switched nodes and libvirt has updated its XML: an
upper bound of the pause the guest's disk sees) and each whole move, median and max.

The steady state: fio inside each guest (through the QEMU guest agent), reading the disk range its
base file backs with O_DIRECT, 4 KiB random reads at queue depth 1 and 1 MiB sequential reads, the
host's page cache dropped before each run; ROUNDS rounds, the guests' order rotated each round,
each guest compared with the one that never used yolofs in the same round.

Usage (as root, libvirtd running):
    python3 bench/scripts/detach_bench.py [--cycles N] [--rounds N] [--fio-seconds S]
"""

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from checkout import REPO  # noqa: E402 (makes the checkout importable)
os.environ.setdefault('OS_NOVA_DISABLE_EVENTLET_PATCHING', '1')

import libvirt  # noqa: E402
from nova.virt.libvirt import guest as libvirt_guest  # noqa: E402

from tests.guest_disk import GUEST_IO_ERROR  # noqa: E402
from yolo_common import images  # noqa: E402
from yolo_common import qemu  # noqa: E402
from yolo_common import yolofs  # noqa: E402
from yolo_nova.virt import detach  # noqa: E402
from yolo_testing import guest_agent  # noqa: E402

GUESTS = ('never on yolofs', 'on the mount', 'detached')
FIO_JOBS = {
    'randread 4 KiB QD1': '--rw=randread --bs=4k --iodepth=1',
    'read 1 MiB QD4': '--rw=read --bs=1M --iodepth=4',
}


def test_image():
    built = subprocess.run([str(REPO / 'tools' / 'build-test-image.sh')], check=True,
                           capture_output=True, text=True)
    return built.stdout.strip().splitlines()[-1]


def summary(seconds):
    ms = [s * 1e3 for s in seconds]
    return '%.1f ms median, %.1f ms max (n=%d)' % (statistics.median(ms), max(ms), len(ms))


def boot(conn, name, disk, console):
    domain = conn.defineXML(qemu.libvirt_domain_xml(name, disk, console))
    domain.create()
    deadline = time.monotonic() + 900
    while qemu.READY_MARKER not in (console.read_bytes() if console.exists() else b''):
        if time.monotonic() > deadline:
            sys.exit('%s did not boot' % name)
        time.sleep(1)
    guest_agent.wait_for_agent(domain)
    return domain


def fio(domain, options, size, seconds):
    """One fio job in the guest; (IOPS, MiB/s, median completion latency in microseconds)."""
    out = guest_agent.run(domain, [
        'fio', '--name=steady', '--filename=/dev/vda', '--direct=1', '--ioengine=libaio',
        '--size=%d' % size, '--runtime=%d' % seconds, '--time_based', '--output-format=json',
        *options.split()], timeout=seconds + 120).check().stdout
    read = json.loads(out)['jobs'][0]['read']
    return read['iops'], read['bw'] / 1024, read['clat_ns']['percentile']['50.000000'] / 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--cycles', type=int, default=10,
                        help='moves each way (2 pivots per move)')
    parser.add_argument('--rounds', type=int, default=6, help='fio rounds over the 3 guests')
    parser.add_argument('--fio-seconds', type=int, default=10, help='length of each fio job')
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix='yolo-detach-bench-', dir='/var/tmp'))
    work.chmod(0o755)
    conn = libvirt.open('qemu:///system')
    domains = {}
    mount = None
    try:
        base_dir = work / '_base'
        base_dir.mkdir()
        base = base_dir / images.base_file_name(str(uuid.uuid4()))
        images.convert_to_raw(test_image(), base)
        # The first boot through the mount learns the boot image; the next one is served by it.
        mount = yolofs.Mount(base_dir, work / 'yolofs', work / 'boot-images',
                             work / 'control.sock', log_path=work / 'yolofs.log', learn=True)
        mount.start()
        on_mount = mount.mountpoint / base.name
        disks = {}
        for n, name in enumerate(GUESTS):
            instance = work / ('instance%d' % n)
            instance.mkdir()
            disks[name] = instance / 'disk'
            images.create_overlay(base if name == 'never on yolofs' else on_mount,
                                  disks[name], size=4 << 30)
            domains[name] = boot(conn, 'yolo-detach-bench-%d' % n, disks[name],
                                 instance / 'console.log')
            print('%s: booted' % name, file=sys.stderr)
            if name == 'on the mount':
                mount.client.record_stop(base.name)

        moving = libvirt_guest.Guest(domains['detached'])
        disk = str(disks['detached'])
        pivots = {'to _base': [], 'to the mount': []}
        moves = {'to _base': [], 'to the mount': []}
        for _ in range(args.cycles):
            for way, target in (('to _base', base), ('to the mount', on_mount)):
                started = time.monotonic()
                pivots[way] += detach.move_backing(moving, 'vda', disk, str(target))
                moves[way].append(time.monotonic() - started)
        detach.move_backing(moving, 'vda', disk, str(base))
        print('# Detach: %d moves each way of a running guest (TCG, cache=none)\n' % args.cycles)
        print('| move | pivot (each move pivots twice) | whole move |')
        print('|---|---|---|')
        for way in pivots:
            print('| %s | %s | %s |' % (way, summary(pivots[way]), summary(moves[way])))

        results = {(name, job): [] for name in GUESTS for job in FIO_JOBS}
        size = base.stat().st_size
        for round_ in range(args.rounds):
            order = GUESTS[round_ % 3:] + GUESTS[:round_ % 3]
            for name in order:
                for job, options in FIO_JOBS.items():
                    qemu.drop_caches()
                    results[name, job].append(fio(domains[name], options, size,
                                                  args.fio_seconds))
                    print('round %d, %s, %s: %.0f IOPS, %.1f MiB/s, p50 %.0f us'
                          % (round_ + 1, name, job, *results[name, job][-1]), file=sys.stderr)
        print('\n# Steady state: fio in each guest over its base file\'s %d MiB (O_DIRECT, '
              '%d s per job, %d rounds)\n' % (size >> 20, args.fio_seconds, args.rounds))
        print('Medians over the rounds; "vs never" is the median of each round\'s ratio to the '
              'guest that never used yolofs (paired: a round\'s drift hits all three).\n')
        columns = ('%s IOPS (p50 latency) | vs never' % job for job in FIO_JOBS)
        print('| guest | %s |' % ' | '.join(columns))
        print('|---|' + '---|---|' * len(FIO_JOBS))
        for name in GUESTS:
            cells = []
            for job in FIO_JOBS:
                iops, _, latency = (statistics.median(v) for v in zip(*results[name, job]))
                paired = [mine[0] / never[0] for mine, never
                          in zip(results[name, job], results['never on yolofs', job])]
                cells += ['%.0f (%.0f us)' % (iops, latency), '%.2fx (%.2f-%.2f)' % (
                    statistics.median(paired), min(paired), max(paired))]
            print('| %s | %s |' % (name, ' | '.join(cells)))

        errors = {name: GUEST_IO_ERROR.findall(
            guest_agent.run(domain, ['dmesg']).check().stdout.encode())
            for name, domain in domains.items()}
        print('\nguest I/O errors in the kernel logs: %s' % (
            ', '.join('%s: %d' % (n, len(e)) for n, e in errors.items())))
    finally:
        for domain in domains.values():
            domain.destroy()
            domain.undefine()
        if mount is not None:
            mount.stop()
        shutil.rmtree(work)


if __name__ == '__main__':
    main()
