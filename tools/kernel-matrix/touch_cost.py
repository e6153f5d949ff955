"""What a touch of a base file costs the boot that follows, on the kernel this runs on.

Run inside a kernel matrix guest (``tools/kernel-matrix/run --bench``): a base file with a boot
image of scattered extents, loaded through a yolofs mount; then, ROUNDS times, Nova's touch
through yolofs (the driver's ``touch``), the page cache dropped, and a "boot": the mounted file
opened and the boot image's extents read with O_DIRECT, as QEMU reads with cache=none. Printed
per round: the bytes yolofs read from the base file between the touch and the end of the boot
(its verification), and the time from the open to the first read served from memory. With
leases (``leases``) and, on the same guest, with leases turned off (``fs.leases-enable=0``: how
yolofs behaved before it took leases, and still behaves where a filesystem refuses them).
"""

import json
import mmap
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import time

from yolo_common import yolofs

SIZE = 512 << 20
ROUNDS = 5
NAME = 'base'


def build(workdir):
    base_dir = workdir / '_base'
    base_dir.mkdir()
    with open(base_dir / NAME, 'wb') as f:
        for _ in range(SIZE >> 20):
            f.write(os.urandom(1 << 20))
    store = workdir / 'boot-images'
    store.mkdir()
    rng = random.Random(2)
    extents = sorted((rng.randrange(SIZE >> 16) << 16, 64 << 10) for _ in range(512))
    trace = workdir / 'trace'
    trace.write_text(''.join('%d %d\n' % e for e in extents))
    yolofs.run('build', '--trace', trace, '--source', base_dir / NAME,
               '--output', store / (NAME + '.yolo'))
    time.sleep(1.1)   # the base file settles: its next write must move its ctime
    return base_dir, store, extents


def yolofs_read_bytes(pid):
    lines = pathlib.Path("/proc/%d/io" % pid).read_text().splitlines()
    io = dict(line.split(": ") for line in lines)
    return int(io['rchar'])


def boot(path, extents, mount):
    """The extents read with O_DIRECT; seconds from the open to the first read from memory."""
    before = mount.client.stats(NAME).get(NAME, {}).get('bytes_memory', 0)
    started = time.monotonic()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    first_from_memory = None
    try:
        for offset, length in extents:
            buf = mmap.mmap(-1, length)
            os.preadv(fd, [buf], offset)
            buf.close()
            if first_from_memory is None and \
                    mount.client.stats(NAME)[NAME]['bytes_memory'] > before:
                first_from_memory = time.monotonic() - started
    finally:
        os.close(fd)
    return first_from_memory


def measure(workdir, leases):
    with open('/proc/sys/fs/leases-enable', 'w') as f:
        f.write('1' if leases else '0')
    base_dir, store, extents = build(workdir)
    mount = yolofs.Mount(source=base_dir, mountpoint=workdir / 'mnt', boot_images=store,
                         control_socket=workdir / 'control.sock', log_path=workdir / 'yolofs.log',
                         no_kernel_passthrough=True)
    rounds = []
    with mount:
        mount.client.preload(NAME)
        boot(mount.mountpoint / NAME, extents, mount)
        pid = mount.process.pid
        for _ in range(ROUNDS):
            kept = mount.client.touch(NAME)['verification_kept']
            with open('/proc/sys/vm/drop_caches', 'w') as f:
                f.write('3')
            read_before = yolofs_read_bytes(pid)
            first = boot(mount.mountpoint / NAME, extents, mount)
            rounds.append({
                'verification_kept': kept,
                'base_file_bytes_read': yolofs_read_bytes(pid) - read_before,
                'open_to_first_memory_read_s': first,
            })
            time.sleep(2)   # past the background re-check of the touch
        safety = mount.client.status()['touch_safety']
    subprocess.run(['rm', '-rf', str(workdir)], check=True)
    return {'leases': leases, 'touch_safety': safety, 'rounds': rounds,
            'boot_image_bytes': sum(length for _, length in extents)}


def main():
    results = {'kernel': os.uname().release, 'filesystem': None, 'runs': []}
    tmp = pathlib.Path(os.environ.get('TMPDIR', '/var/tmp'))
    results['filesystem'] = subprocess.run(['stat', '-f', '-c', '%T', str(tmp)],
                                           capture_output=True, text=True).stdout.strip()
    for leases in (False, True):
        results['runs'].append(measure(pathlib.Path(tempfile.mkdtemp(dir=tmp)), leases))
    with open('/proc/sys/fs/leases-enable', 'w') as f:
        f.write('1')
    print('TOUCH-COST ' + json.dumps(results))
    for run in results['runs']:
        for i, r in enumerate(run['rounds']):
            print('%-9s round %d: kept %-5s  base file read %10d B  open to first memory read %s'
                  % ('leases' if run['leases'] else 'no lease', i, r['verification_kept'],
                     r['base_file_bytes_read'],
                     '%.3f s' % r['open_to_first_memory_read_s']
                     if r['open_to_first_memory_read_s'] is not None else 'never'))


if __name__ == '__main__':
    sys.exit(main())
