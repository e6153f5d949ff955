"""A real yolofs FUSE mount: every read compared with the source file, byte for byte."""

import concurrent.futures
import contextlib
import ctypes
import errno
import json
import mmap
import os
import pathlib
import random
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest

from tests import prometheus
from tests.yolofs import kernel
from yolo_common import yolofs

SIZE = 24 << 20
NAME = '3f786850e387550fdab836ed7e6dc881de23001b'


@pytest.fixture
def base_dir(tmp_path):
    base = tmp_path / '_base'
    base.mkdir()
    rng = random.Random(5)
    (base / NAME).write_bytes(rng.randbytes(SIZE))
    return base


@pytest.fixture
def content(base_dir):
    return (base_dir / NAME).read_bytes()


@pytest.fixture
def boot_image_dir(tmp_path, base_dir):
    """A boot image of scattered ranges, as a boot reads them."""
    store = tmp_path / 'boot-images'
    store.mkdir()
    rng = random.Random(9)
    trace = tmp_path / 'trace'
    trace.write_text(''.join('%d %d\n' % (rng.randrange(SIZE), rng.randrange(1, 200000))
                             for _ in range(150)))
    yolofs.run('build', '--trace', trace, '--source', base_dir / NAME,
               '--output', store / (NAME + '.yolo'))
    return store


def random_ranges(seed, count, size=SIZE, align=1):
    rng = random.Random(seed)
    for _ in range(count):
        offset = rng.randrange(0, size + 8192) // align * align
        length = max(align, rng.randrange(1, 400000) // align * align)
        yield offset, length


def read_buffered(path, ranges):
    fd = os.open(path, os.O_RDONLY)
    try:
        return [os.pread(fd, length, offset) for offset, length in ranges]
    finally:
        os.close(fd)


def read_direct(path, ranges):
    """O_DIRECT reads, as QEMU makes them with cache=none: aligned buffers, offsets, lengths."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        out = []
        for offset, length in ranges:
            buf = mmap.mmap(-1, length)
            n = os.preadv(fd, [buf], offset)
            out.append(bytes(buf[:n]))
            buf.close()
        return out
    finally:
        os.close(fd)


def expected(content, ranges):
    return [content[offset:offset + length] for offset, length in ranges]


@pytest.mark.parametrize('reader,align', [(read_buffered, 1), (read_direct, 4096)],
                         ids=['buffered', 'o_direct'])
def test_reads_equal_the_source_with_a_boot_image(mount_factory, base_dir, boot_image_dir,
                                                  content, reader, align):
    mount = mount_factory(base_dir, boot_images=boot_image_dir)
    ranges = list(random_ranges(1, 400, align=align))
    assert reader(mount.mountpoint / NAME, ranges) == expected(content, ranges)
    stats = mount.client.stats(NAME)[NAME]
    # Random ranges straddle covered and uncovered parts: all three kinds of request happen.
    assert stats['requests_mixed'] > 0, stats
    assert stats['requests_passthrough'] > 0, stats
    assert stats['bytes_memory'] > 0, stats


@pytest.mark.parametrize('kernel_passthrough', [True, False], ids=['kernel', 'daemon'])
def test_reads_equal_the_source_without_a_boot_image(mount_factory, base_dir, content,
                                                     kernel_passthrough):
    mount = mount_factory(base_dir, no_kernel_passthrough=not kernel_passthrough)
    # Before Linux 6.9 the kernel has no passthrough: yolofs serves every read itself.
    kernel_passthrough = kernel_passthrough and kernel.fuse_passthrough()
    assert mount.client.status().answer['kernel_passthrough'] is kernel_passthrough
    ranges = list(random_ranges(2, 200))
    assert read_buffered(mount.mountpoint / NAME, ranges) == expected(content, ranges)
    direct_ranges = list(random_ranges(3, 100, align=4096))
    assert read_direct(mount.mountpoint / NAME, direct_ranges) == expected(content, direct_ranges)
    assert (mount.mountpoint / NAME).read_bytes() == content
    stats = mount.client.stats(NAME)[NAME]
    assert stats['bytes_memory'] == 0
    if kernel_passthrough:
        # The kernel read the source itself: yolofs saw the opens, not the reads.
        assert stats['opens_kernel_passthrough'] == stats['opens'] == 3, stats
        assert stats['bytes_passthrough'] == 0, stats
    else:
        assert stats['opens_kernel_passthrough'] == 0, stats
        assert stats['bytes_passthrough'] >= SIZE, stats


def covered_offset(boot_image_dir):
    """An offset inside the boot image's first extent."""
    info = yolofs.run('inspect', '--json', '--extents', boot_image_dir / (NAME + '.yolo')).stdout
    extent = json.loads(info)['extents'][0]
    return extent['source_offset'] + extent['length'] // 2


def change_in_place(path, offset, keep_mtime):
    """Flips one byte of a file in place: same inode, size and birth time."""
    before = os.stat(path)
    with open(path, 'r+b') as f:
        f.seek(offset)
        old = f.read(1)
        f.seek(offset)
        f.write(bytes([old[0] ^ 0xff]))
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    return path.read_bytes()


def served(mount, ranges, reader):
    return reader(mount.mountpoint / NAME, ranges)


@pytest.mark.parametrize('keep_mtime', [False, True], ids=['mtime', 'mtime_restored'])
def test_a_changed_base_file_is_never_served_from_its_boot_image(
        mount_factory, base_dir, boot_image_dir, content, keep_mtime):
    mount = mount_factory(base_dir, boot_images=boot_image_dir, no_kernel_passthrough=True)
    offset = covered_offset(boot_image_dir)
    ranges = [(offset - offset % 4096, 4096)] + list(random_ranges(3, 1200, align=4096))
    assert served(mount, ranges, read_direct) == expected(content, ranges)
    assert mount.client.stats(NAME)[NAME]['bytes_memory'] > 0
    # One byte changed where the boot image covers, with the file open and the boot image loaded.
    with open(mount.mountpoint / NAME, 'rb') as held:
        held.read(1 << 20)
        changed = change_in_place(base_dir / NAME, offset, keep_mtime)
        # O_DIRECT reads (QEMU's, with cache=none) see the new byte at once: every read checks.
        assert served(mount, ranges, read_direct) == expected(changed, ranges)
        assert os.pread(held.fileno(), 1, offset) == changed[offset:offset + 1]
    # Buffered reads go through the mount's page cache: the watcher drops it on the write.
    assert served(mount, ranges, read_buffered) == expected(changed, ranges)
    # Verified again in the background: the changed bytes no longer match, it is refused.
    wait_for(lambda: mount.client.status().answer['rejected'])
    assert 'differs from the source file' in mount.client.status().answer['rejected'][0]['reason']
    memory = mount.client.stats(NAME)[NAME]['bytes_memory']
    assert served(mount, ranges, read_direct) == expected(changed, ranges)
    assert mount.client.stats(NAME)[NAME]['bytes_memory'] == memory


LEASES_ENABLE = '/proc/sys/fs/leases-enable'


@contextlib.contextmanager
def no_leases():
    """Leases turned off machine-wide (fs.leases-enable), NFS delegations with them."""
    with open(LEASES_ENABLE) as f:
        before = f.read()
    with open(LEASES_ENABLE, 'w') as f:
        f.write('0')
    try:
        yield
    finally:
        with open(LEASES_ENABLE, 'w') as f:
            f.write(before)


# 'no_leases' turns leases off machine-wide: never beside other tests (serial).
@pytest.fixture(params=['leases', pytest.param('no_leases', marks=pytest.mark.serial)])
def leases(request):
    """Whether the kernel grants leases: 'no_leases' turns them off machine-wide
    (as on a filesystem without them) for the test."""
    if request.param == 'leases':
        yield True
        return
    with no_leases():
        yield False


def verifications(mount):
    return mount.log_path.read_text().count('verifying boot image')


def served_again_after_a_touch(mount, ranges, content, verified_before, kept):
    """After the base file's times were set: its boot image kept, or (not kept) verified again
    in the background, once; then its reads served from memory again."""
    if kept:
        time.sleep(2)   # beyond the watcher's reverification delay
    else:
        wait_for(lambda: verifications(mount) > verified_before)
    wait_for(lambda: NAME in {e['name'] for e in mount.client.status().answer['loaded']})
    memory = mount.client.stats(NAME)[NAME]['bytes_memory']
    assert served(mount, ranges, read_direct) == expected(content, ranges)
    assert mount.client.stats(NAME)[NAME]['bytes_memory'] > memory
    assert verifications(mount) == verified_before + (0 if kept else 1)


def test_touch_safety_is_known_before_any_base_file(mount_factory, tmp_path, leases):
    empty = tmp_path / 'empty_base'
    empty.mkdir()
    mount = mount_factory(empty)
    assert mount.client.status().answer['touch_safety']['mechanism'] == (
        'leases' if leases and kernel.leases_taken(empty)
        else 'multigrain_timestamps' if kernel.multigrain_timestamps(empty) else 'none')
    # Tried on an unnamed file: Nova's image cache sees nothing.
    assert list(empty.iterdir()) == []


PR_CAPBSET_DROP, CAP_LEASE = 24, 28
NOBODY = 65534


def without_cap_lease():
    """yolofs' preexec_fn: its capabilities without CAP_LEASE, as under a unit that leaves it
    out of its bounding set."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_CAPBSET_DROP, CAP_LEASE, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), 'prctl(PR_CAPBSET_DROP, CAP_LEASE)')


@pytest.mark.parametrize('cap_lease', [True, False], ids=['cap_lease', 'no_cap_lease'])
def test_base_files_of_another_user_are_leased_with_cap_lease_only(
        mount_factory, tmp_path, cap_lease):
    # Nova's _base and its files are nova's: yolofs, root, leases them only with CAP_LEASE
    # (etc/yolofs.service keeps it), and says at start when it cannot.
    base = tmp_path / 'novas_base'
    base.mkdir()
    os.chown(base, NOBODY, NOBODY)
    mount = mount_factory(base, **({} if cap_lease else {'preexec_fn': without_cap_lease}))
    safety = mount.client.status().answer['touch_safety']
    local = kernel.leases_taken(base)
    assert safety['mechanism'] == (
        'leases' if cap_lease and local
        else 'multigrain_timestamps' if kernel.multigrain_timestamps(base) else 'none')
    if local and not cap_lease:
        assert 'neither the file\'s owner nor CAP_LEASE' in safety['lease_error']


def test_a_base_file_whose_times_were_set_keeps_its_boot_image_under_a_lease(
        mount_factory, base_dir, boot_image_dir, content, leases):
    # Nova's image cache manager touches base files in use: their ctime moves, their bytes not.
    mount = mount_factory(base_dir, boot_images=boot_image_dir, no_kernel_passthrough=True)
    ranges = list(random_ranges(4, 200, align=4096))
    assert served(mount, ranges, read_direct) == expected(content, ranges)
    status = mount.client.status().answer
    leased = leases and kernel.leases_taken(base_dir)
    assert status['touch_safety']['mechanism'] == (
        'leases' if leased else 'multigrain_timestamps' if kernel.multigrain_timestamps(base_dir)
        else 'none')
    assert [e['leased'] for e in status['loaded']] == [leased]
    before = verifications(mount)
    os.utime(base_dir / NAME)
    served_again_after_a_touch(mount, ranges, content, before, kept=leased)
    assert not mount.client.status().answer['rejected']


@pytest.mark.parametrize('coarse', [False, True], ids=['kernel_timestamps', 'coarse_timestamps'])
def test_a_base_file_touched_through_yolofs_keeps_its_boot_image(
        mount_factory, base_dir, boot_image_dir, content, leases, coarse, monkeypatch):
    # What the driver has Nova's image backend do at each disk it creates over a base file.
    # coarse: yolofs behaves as on a kernel without multigrain timestamps (before Linux 6.13).
    if coarse:
        monkeypatch.setenv('YOLOFS_ASSUME_COARSE_TIMESTAMPS', '1')
    mount = mount_factory(base_dir, boot_images=boot_image_dir, no_kernel_passthrough=True)
    ranges = list(random_ranges(5, 200, align=4096))
    assert served(mount, ranges, read_direct) == expected(content, ranges)
    before = verifications(mount)
    os.utime(base_dir / NAME, (1000, 1000))
    leased = leases and kernel.leases_taken(base_dir)
    if not leased:
        wait_for(lambda: verifications(mount) > before)
    wait_for(lambda: NAME in {e['name'] for e in mount.client.status().answer['loaded']})
    before = verifications(mount)
    # Kept under a lease on every kernel; without one, only where a ctime moves at every change.
    kept = leased or (not coarse and kernel.multigrain_timestamps(base_dir))
    assert mount.client.touch(NAME)['verification_kept'] is kept
    assert time.time() - os.stat(base_dir / NAME).st_mtime < 60
    served_again_after_a_touch(mount, ranges, content, before, kept)
    with pytest.raises(yolofs.YolofsError, match='No such file'):
        mount.client.touch('no-such-base-file')


def test_a_write_right_after_a_touch_is_never_served_from_the_boot_image(
        mount_factory, base_dir, boot_image_dir, content, leases, monkeypatch):
    # On a kernel without multigrain timestamps, a write in the clock tick of a touch leaves the
    # ctime where the touch set it: the lease, not the ctime, must tell.
    monkeypatch.setenv('YOLOFS_ASSUME_COARSE_TIMESTAMPS', '1')
    mount = mount_factory(base_dir, boot_images=boot_image_dir, no_kernel_passthrough=True)
    offset = covered_offset(boot_image_dir)
    ranges = [(offset - offset % 4096, 4096)] + list(random_ranges(6, 300, align=4096))
    with open(mount.mountpoint / NAME, 'rb') as held:
        assert served(mount, ranges, read_direct) == expected(content, ranges)
        mount.client.touch(NAME)
        changed = change_in_place(base_dir / NAME, offset, keep_mtime=True)
        assert served(mount, ranges, read_direct) == expected(changed, ranges)
        assert os.pread(held.fileno(), 1, offset) == changed[offset:offset + 1]
    wait_for(lambda: mount.client.status().answer['rejected'])
    assert served(mount, ranges, read_buffered) == expected(changed, ranges)


@pytest.fixture
def other_nfs_client():
    """The root of ``_base``'s export as another NFS client mounts it. Both mounts are one NFS
    client (one client id per kernel): the server would not recall the read delegation the
    first holds when the second writes, as it does when another host writes. Without
    delegations (nfsd takes them as leases; turned off before any file is opened) the first
    sees the write by its attributes, as it would after the recall. yolofs takes no lease on
    NFS anyway."""
    other_root = os.environ.get('YOLO_NFS_OTHER_CLIENT')
    if not other_root:
        pytest.skip('needs _base on NFS and a second client: tools/kernel-matrix/run --fs nfs')
    with no_leases():
        yield pathlib.Path(other_root)


def test_a_write_from_another_nfs_client_is_seen_once_the_attributes_expire(
        other_nfs_client, mount_factory, base_dir, boot_image_dir, content):
    """``_base`` shared over NFS (Nova's shared instance storage): yolofs takes no lease there
    and no local mechanism sees another client's write; the ctime this client caches for the
    attribute timeout (``actimeo``) is what tells, as docs/yolofs.md says. The matrix mounts
    the same export twice (tools/kernel-matrix/guest-run, --fs nfs): the second mount, with a
    cache of its own, is the other client."""
    actimeo = float(os.environ['YOLO_NFS_ACTIMEO'])
    other = other_nfs_client / (base_dir / NAME).relative_to(os.environ['YOLO_NFS_MOUNT'])
    mount = mount_factory(base_dir, boot_images=boot_image_dir, no_kernel_passthrough=True)
    offset = covered_offset(boot_image_dir)
    ranges = [(offset - offset % 4096, 4096)] + list(random_ranges(7, 200, align=4096))
    assert served(mount, ranges, read_direct) == expected(content, ranges)
    status = mount.client.status().answer
    assert status['touch_safety']['mechanism'] == 'none'
    assert 'not a local filesystem' in status['touch_safety']['lease_error']
    changed = change_in_place(other, offset, keep_mtime=True)
    time.sleep(2 * actimeo + 1)
    assert served(mount, ranges, read_direct) == expected(changed, ranges)
    wait_for(lambda: mount.client.status().answer['rejected'])
    assert served(mount, ranges, read_buffered) == expected(changed, ranges)


def test_reads_during_a_change_are_old_or_new_and_new_once_it_is_written(
        mount_factory, base_dir, boot_image_dir, content):
    mount = mount_factory(base_dir, boot_images=boot_image_dir, no_kernel_passthrough=True)
    # Loaded before the readers start: a file written less than a second ago is only vouched
    # for once it has settled (its next write must move its ctime), which the load waits for.
    mount.client.preload(NAME)
    offset = covered_offset(boot_image_dir)
    page = offset - offset % 4096
    reads, stop = [], threading.Event()

    def reader():
        fd = os.open(mount.mountpoint / NAME, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, 4096)
        while not stop.is_set():
            started = time.monotonic()
            os.preadv(fd, [buf], page)
            reads.append((started, bytes(buf)))
        os.close(fd)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    changed = change_in_place(base_dir / NAME, offset, keep_mtime=True)
    written = time.monotonic()
    time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join()
    old, new = content[page:page + 4096], changed[page:page + 4096]
    assert all(data in (old, new) for _, data in reads)
    after = [data for started, data in reads if started > written]
    assert after and all(data == new for data in after), sum(data == old for data in after)


def wait_for(predicate, timeout=30):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, 'timed out'
        time.sleep(0.1)


def test_boot_image_arriving_while_passthrough_opens_remain(mount_factory, base_dir,
                                                            content, tmp_path):
    """A file open in kernel passthrough (no boot image yet) does not keep later opens from the
    boot image: the kernel allows no other kind of open on a passthrough inode, so the next lookup
    hands out another inode for the same file."""
    store = tmp_path / 'store'
    store.mkdir()
    mount = mount_factory(base_dir, boot_images=store, attr_timeout_secs=0)
    path = mount.mountpoint / NAME
    early = os.open(path, os.O_RDONLY)
    try:
        early_ino = os.fstat(early).st_ino
        trace = tmp_path / 'trace'
        trace.write_text('0 1048576\n')
        yolofs.run('build', '--trace', trace, '--source', base_dir / NAME,
                   '--output', store / (NAME + '.yolo'))
        ranges = list(random_ranges(4, 50))
        assert read_buffered(path, ranges) == expected(content, ranges)
        assert os.pread(early, 4096, 0) == content[:4096]
        stats = mount.client.stats(NAME)[NAME]
        assert stats['bytes_memory'] > 0, stats
        if kernel.fuse_passthrough():
            assert os.stat(path).st_ino != early_ino
            assert stats['opens_kernel_passthrough'] == 1, stats
        else:
            # Before Linux 6.9: one inode, served by yolofs, from the boot image once it is there.
            assert os.stat(path).st_ino == early_ino
            assert stats['opens_kernel_passthrough'] == 0, stats
    finally:
        os.close(early)
    assert path.read_bytes() == content


def test_concurrent_readers(mount_factory, base_dir, boot_image_dir, content):
    mount = mount_factory(base_dir, boot_images=boot_image_dir, threads=8)
    path = mount.mountpoint / NAME

    def worker(seed):
        ranges = list(random_ranges(seed, 150, align=4096))
        reader = read_direct if seed % 2 else read_buffered
        return reader(path, ranges) == expected(content, ranges)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        assert all(pool.map(worker, range(100, 132)))


def test_writes_fail_with_erofs(mount_factory, base_dir):
    mount = mount_factory(base_dir)
    for flags in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_CREAT):
        with pytest.raises(OSError) as err:
            os.open(mount.mountpoint / NAME, flags)
        assert err.value.errno == errno.EROFS
    for action in (lambda: (mount.mountpoint / 'new').write_bytes(b'x'),
                   lambda: os.unlink(mount.mountpoint / NAME),
                   lambda: os.rename(mount.mountpoint / NAME, mount.mountpoint / 'x'),
                   lambda: os.mkdir(mount.mountpoint / 'd')):
        with pytest.raises(OSError) as err:
            action()
        assert err.value.errno == errno.EROFS
    assert os.stat(base_dir / NAME).st_size == SIZE


def test_source_changes_show_up(mount_factory, base_dir):
    mount = mount_factory(base_dir, attr_timeout_secs=0)
    # Nova downloads to <name>.part, then renames it into place.
    (base_dir / 'new.part').write_bytes(b'partial')
    assert sorted(os.listdir(mount.mountpoint)) == sorted([NAME, 'new.part'])
    (base_dir / 'new.part').write_bytes(b'complete image')
    os.rename(base_dir / 'new.part', base_dir / 'new')
    assert sorted(os.listdir(mount.mountpoint)) == sorted([NAME, 'new'])
    assert (mount.mountpoint / 'new').read_bytes() == b'complete image'
    assert not (mount.mountpoint / 'new.part').exists()
    os.unlink(base_dir / 'new')
    assert not (mount.mountpoint / 'new').exists()
    assert os.listdir(mount.mountpoint) == [NAME]


def test_source_file_vanishing_while_open(mount_factory, base_dir, boot_image_dir, content):
    mount = mount_factory(base_dir, boot_images=boot_image_dir, attr_timeout_secs=0)
    fd = os.open(mount.mountpoint / NAME, os.O_RDONLY)
    try:
        os.unlink(base_dir / NAME)
        (base_dir / NAME).write_bytes(b'\0' * SIZE)
        # The open file keeps its own bytes: never the new file's, never zeros.
        ranges = list(random_ranges(3, 100))
        assert [os.pread(fd, length, offset) for offset, length in ranges] == \
            expected(content, ranges)
    finally:
        os.close(fd)
    os.unlink(base_dir / NAME)
    with pytest.raises(FileNotFoundError):
        open(mount.mountpoint / NAME, 'rb')


def test_corrupt_boot_image_is_never_served(mount_factory, base_dir, boot_image_dir, content):
    path = boot_image_dir / (NAME + '.yolo')
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    mount = mount_factory(base_dir, boot_images=boot_image_dir)
    with pytest.raises(yolofs.YolofsError, match='checksum mismatch'):
        mount.client.preload(NAME)
    assert (mount.mountpoint / NAME).read_bytes() == content
    assert mount.client.stats(NAME)[NAME]['bytes_memory'] == 0
    assert mount.client.status().answer['rejected'][0]['name'] == NAME


def test_mismatching_boot_image_is_never_served(mount_factory, base_dir, boot_image_dir,
                                                tmp_path):
    other = bytearray((base_dir / NAME).read_bytes())
    for i in range(0, SIZE, 4096):
        other[i] ^= 0x5a
    (base_dir / NAME).write_bytes(bytes(other))
    mount = mount_factory(base_dir, boot_images=boot_image_dir)
    assert (mount.mountpoint / NAME).read_bytes() == bytes(other)
    assert mount.client.stats(NAME)[NAME]['bytes_memory'] == 0
    assert 'differs from the source file' in mount.client.status().answer['rejected'][0]['reason']


def test_preload_evict_budget_and_mlock(mount_factory, base_dir, boot_image_dir, content):
    mount = mount_factory(base_dir, boot_images=boot_image_dir, mlock=True)
    loaded = mount.client.preload(NAME)
    assert loaded['bytes'] > 0 and loaded['locked'] is True
    status = mount.client.status().answer
    assert status['memory_used_bytes'] == loaded['bytes']
    with open('/proc/%d/status' % mount.process.pid) as f:
        locked_kib = int(next(line for line in f if line.startswith('VmLck:')).split()[1])
    assert locked_kib * 1024 >= loaded['bytes']
    assert mount.client.evict(NAME)['evicted'] is True
    assert mount.client.status().answer['memory_used_bytes'] == 0
    with pytest.raises(yolofs.YolofsError, match='invalid base file name'):
        mount.client.preload('../etc/passwd')
    # Served again after eviction: loaded on open.
    assert (mount.mountpoint / NAME).read_bytes() == content
    assert mount.client.stats(NAME)[NAME]['bytes_memory'] > 0


def test_memory_budget_evicts_least_recently_used(mount_factory, base_dir, tmp_path):
    store = tmp_path / 'store'
    store.mkdir()
    for i in range(3):
        name = 'img%d' % i
        # Bytes of its own: boot images of equal files share their blocks (below).
        (base_dir / name).write_bytes(random.Random(i).randbytes(SIZE))
        trace = tmp_path / ('t%d' % i)
        trace.write_text('0 %d\n' % (600 << 10))
        yolofs.run('build', '--trace', trace, '--source', base_dir / name,
                   '--output', store / (name + '.yolo'))
    mount = mount_factory(base_dir, boot_images=store, memory_budget_mib=1)
    for i in range(3):
        mount.client.preload('img%d' % i)
    loaded = [entry['name'] for entry in mount.client.status().answer['loaded']]
    assert loaded == ['img2'], loaded


@pytest.mark.parametrize('sharing', [True, False], ids=['block pool', 'no block sharing'])
def test_boot_images_of_related_files_share_their_blocks_and_serve_their_own_bytes(
        mount_factory, base_dir, tmp_path, content, sharing):
    # Three variants of one file, as an image, its snapshot and a rebuild are: each with blocks
    # of its own where the others have theirs; boot images of the same 2 MiB of each, installed
    # as Nova installs them.
    store, published = tmp_path / 'store', tmp_path / 'published'
    store.mkdir()
    published.mkdir()
    variants = {}
    for i in range(3):
        data = bytearray(content)
        for block in range(i, 512, 8):
            data[block * 4096:(block + 1) * 4096] = random.Random(block * 3 + i).randbytes(4096)
        name = 'variant%d' % i
        (base_dir / name).write_bytes(bytes(data))
        variants[name] = bytes(data)
        trace = tmp_path / ('t%d' % i)
        trace.write_text('0 %d\n' % (2 << 20))
        yolofs.run('build', '--trace', trace, '--source', base_dir / name,
                   '--output', published / (name + '.yolo'))
    mount = mount_factory(base_dir, boot_images=store, no_block_sharing=not sharing,
                          metrics_address='127.0.0.1:0')
    for name in variants:
        mount.client.install(name, published / (name + '.yolo'), str(uuid.uuid4()))
        assert mount.client.preload(name)['bytes'] == 2 << 20
    status = mount.client.status().answer
    # 512 blocks each, 1 in 8 of its own: 320 blocks the same in all three, and where one has
    # 64 of its own, the other two share the original's.
    distinct = (320 + 3 * (64 + 64)) * 4096
    block_file = store / 'blocks.pack'
    if sharing:
        pool = status['block_pool']
        assert (pool['bytes'], pool['charged_bytes']) == (distinct, distinct)
        assert pool['charged_image_bytes'] == 3 * (2 << 20)
        assert status['memory_used_bytes'] == distinct
        # On disk too: each distinct block once in the block file, the boot images packed.
        on_disk = status['block_file']
        assert (on_disk['boot_images'], on_disk['image_bytes']) == (3, 3 * (2 << 20))
        assert on_disk['bytes'] == distinct
        # The file's blocks: its slots', and maybe a block or two of the file system's extent map.
        assert distinct <= block_file.stat().st_blocks * 512 <= distinct + (16 << 10)
        assert all(json.loads(yolofs.run('inspect', '--json', store / (name + '.yolo')).stdout)[
            'packed'] for name in variants)
    else:
        assert 'block_pool' not in status and 'block_file' not in status
        assert status['memory_used_bytes'] == 3 * (2 << 20)
        assert not block_file.exists()
    # Each reads its own bytes, the shared blocks and its own, from memory.
    for name, data in variants.items():
        assert (mount.mountpoint / name).read_bytes() == data
        assert mount.client.stats(name)[name]['bytes_memory'] >= 2 << 20
    metrics = scrape(mount)
    assert metrics[('yolofs_memory_used_bytes', ())] == status['memory_used_bytes']
    if sharing:
        assert metrics[('yolofs_memory_unshared_bytes', ())] == 3 * (2 << 20)
        assert metrics[('yolofs_block_pool_bytes', ())] == distinct
        assert metrics[('yolofs_block_file_bytes', ())] == distinct
        assert metrics[('yolofs_block_file_image_bytes', ())] == 3 * (2 << 20)
    else:
        assert ('yolofs_block_pool_bytes', ()) not in metrics
    # Started again, yolofs reads them from the store as they were installed.
    mount.stop()
    mount = mount_factory(base_dir, boot_images=store, no_block_sharing=not sharing)
    wait_for(lambda: mount.client.status().answer.get('block_file') == status.get('block_file'))
    for name, data in variants.items():
        assert (mount.mountpoint / name).read_bytes() == data
        assert mount.client.stats(name)[name]['bytes_memory'] >= 2 << 20


def test_a_store_without_room_for_a_boot_images_blocks_keeps_what_it_had(
        mount_factory, base_dir, tmp_path):
    # A store on a 3 MiB file system: one boot image's 2 MiB of blocks fit, two do not.
    store, published = tmp_path / 'store', tmp_path / 'published'
    store.mkdir()
    published.mkdir()
    subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=3m', 'tmpfs', store], check=True)
    try:
        for name in ('first', 'second'):
            (base_dir / name).write_bytes(random.Random(name).randbytes(SIZE))
            trace = tmp_path / ('t-' + name)
            trace.write_text('0 %d\n' % (2 << 20))
            yolofs.run('build', '--trace', trace, '--source', base_dir / name,
                       '--output', published / (name + '.yolo'))
        mount = mount_factory(base_dir, boot_images=store)
        mount.client.install('first', published / 'first.yolo', str(uuid.uuid4()))
        held = mount.client.status().answer['block_file']
        with pytest.raises(yolofs.YolofsError, match='No space left on device'):
            mount.client.install('second', published / 'second.yolo', str(uuid.uuid4()))
        # The blocks it wrote are given back; the first reads as it did; nothing is half there.
        assert mount.client.status().answer['block_file'] == held
        assert (store / 'blocks.pack').stat().st_blocks * 512 == 2 << 20
        assert not (store / 'second.yolo').exists()
        assert (mount.mountpoint / 'first').read_bytes() == (base_dir / 'first').read_bytes()
        assert mount.client.stats('first')['first']['bytes_memory'] >= 2 << 20
        mount.stop()
    finally:
        subprocess.run(['umount', '-l', store], check=True)


def test_preload_at_start_loads_the_newest_base_files_within_the_budget(
        mount_factory, base_dir, tmp_path):
    # Three boot images of 600 KiB, a budget of 1 MiB: the newest base file's is preloaded, the
    # others are left out (preloading never evicts), and a boot image loaded on open stays.
    store = tmp_path / 'store'
    store.mkdir()
    now = time.time()
    for age, name in enumerate(('new', 'middle', 'old')):
        (base_dir / name).write_bytes(random.Random(age).randbytes(SIZE))
        os.utime(base_dir / name, (now - 60 * age, now - 60 * age))
        trace = tmp_path / ('t-' + name)
        trace.write_text('0 %d\n' % (600 << 10))
        yolofs.run('build', '--trace', trace, '--source', base_dir / name,
                   '--output', store / (name + '.yolo'))
    time.sleep(1)   # the base files' ctimes settle, as long ago on a host back from a reboot
    mount = mount_factory(base_dir, boot_images=store, memory_budget_mib=1, preload=True)
    wait_for(lambda: (mount.client.status().answer.get('preload') or {}).get('done'))
    progress = mount.client.status().answer['preload']
    assert (progress['loaded'], progress['bytes'], progress['skipped']) == (1, 600 << 10, 2)
    assert [e['name'] for e in mount.client.status().answer['loaded']] == ['new']
    assert (mount.mountpoint / 'new').read_bytes() == (base_dir / 'new').read_bytes()
    # Without --preload, status has no preload at all.
    assert 'preload' not in mount_factory(base_dir, boot_images=store).client.status().answer


def test_host_load_is_reported(mount_factory, base_dir):
    mount = mount_factory(base_dir, load_interval_secs=0.2, load_smoothing_secs=1)
    import time
    time.sleep(1)
    load = mount.client.host_load()
    assert 0.0 <= load.io_utilisation <= 1.0
    assert 0.0 <= load.cpu_utilisation <= 1.0
    assert 0.0 <= load.idlest_cpu_utilisation <= load.cpu_utilisation
    assert load.samples >= 2 and load.device and load.smoothing_seconds == 1.0
    # This kernel reports CPU pressure (PSI); a kernel without it would report null.
    if os.path.exists('/proc/pressure/cpu'):
        assert 0.0 <= load.cpu_pressure <= 1.0
    else:
        assert load.cpu_pressure is None


def test_sigterm_unmounts_cleanly(mount_factory, base_dir):
    mount = mount_factory(base_dir)
    fd = os.open(mount.mountpoint / NAME, os.O_RDONLY)
    os.close(fd)
    mountpoint = mount.mountpoint
    assert mount.stop() == 0
    assert not yolofs.is_mounted(mountpoint)
    assert not mount.control_socket.exists()


def test_a_mount_started_right_after_a_kill_replaces_the_dead_one(
        mount_factory, base_dir, content, tmp_path):
    dead = mount_factory(base_dir, no_kernel_passthrough=True)
    held = os.open(dead.mountpoint / NAME, os.O_RDONLY)
    try:
        dead.process.kill()     # not waited for: the new one starts while it is being reaped
        again = yolofs.Mount(base_dir, dead.mountpoint, tmp_path / 'boot-images',
                             dead.control_socket, log_path=tmp_path / 'again.log',
                             no_kernel_passthrough=True)
        with again:
            assert (again.mountpoint / NAME).read_bytes() == content
            # The file held open on the dead mount fails; it never reads the new one's bytes.
            with pytest.raises(OSError) as err:
                os.pread(held, 4096, 0)
            assert err.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    finally:
        with contextlib.suppress(OSError):   # closing flushes: ENOTCONN
            os.close(held)
        dead.process.wait()
        dead.process = None


def serving_pid(mount, other_than=None, timeout=30):
    """The pid of the yolofs serving a kept mount (once it is not `other_than`)."""
    deadline = time.monotonic() + timeout
    while True:
        # A yolofs killed in the middle of its answer leaves it cut short (not JSON).
        with contextlib.suppress(OSError, ValueError):
            pid = mount.client.status().answer['pid']
            if pid != other_than:
                return pid
        assert time.monotonic() < deadline, 'no yolofs took the mount over'
        time.sleep(0.05)


class Readers:
    """Threads reading random ranges of a file through the mount until stopped, O_DIRECT (each
    read reaches yolofs) on descriptors opened once, before any restart; every read checked."""

    def __init__(self, path, content, count=4):
        self.content = content
        self.stop = threading.Event()
        self.reads = 0
        self.failures = []
        self.fds = [os.open(path, os.O_RDONLY | os.O_DIRECT) for _ in range(count)]
        self.threads = [threading.Thread(target=self.run, args=(fd, seed))
                        for seed, fd in enumerate(self.fds)]
        for thread in self.threads:
            thread.start()

    def run(self, fd, seed):
        buf = mmap.mmap(-1, 1 << 20)
        for offset, length in random_ranges(seed, 1 << 30, align=4096):
            if self.stop.is_set():
                break
            length = min(length, len(buf))
            try:
                n = os.preadv(fd, [memoryview(buf)[:length]], offset)
            except OSError as e:
                self.failures.append('read of %d at %d: %s' % (length, offset, e))
                continue
            if buf[:n] != self.content[offset:offset + length]:
                self.failures.append('read of %d at %d: wrong bytes' % (length, offset))
            self.reads += 1

    def read_on(self, count=20):
        """Waits until `count` more reads have been made."""
        reads = self.reads
        wait_for(lambda: self.reads > reads + count)

    def finish(self):
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
        for fd in self.fds:
            with contextlib.suppress(OSError):   # on a mount given up, closing flushes: ENOTCONN
                os.close(fd)
        self.fds = []
        return self.reads


def assert_mount_given_up(mount, readers, mount_id, content):
    """Before Linux 6.9 a yolofs taking a mount over cannot have the requests its predecessor
    left unanswered sent again (FUSE_NOTIFY_RESEND): it gives the mount up and mounts afresh
    (docs/operations.md). Reads on the old mount fail, none returns a wrong byte, and new opens
    read the new mount."""
    wait_for(lambda: readers.failures)
    readers.finish()
    assert not [failure for failure in readers.failures if failure.endswith('wrong bytes')]
    assert not mount.client.status().answer['took_over_mount']
    assert os.stat(mount.mountpoint).st_dev != mount_id
    assert (mount.mountpoint / NAME).read_bytes() == content


def test_a_kept_mount_survives_kills_with_reads_in_flight(mount_factory, base_dir,
                                                          boot_image_dir, content):
    """SIGKILL (a crash, the OOM killer) under readers: the keeper starts yolofs again on the
    same mount, which serves the descriptors opened before, and the kernel sends again what the
    killed one had read and not answered: no reader sees an error or a wrong byte."""
    mount = mount_factory(base_dir, boot_images=boot_image_dir, kept=True)
    path = mount.mountpoint / NAME
    mount_id = os.stat(mount.mountpoint).st_dev
    first = serving_pid(mount)
    readers = Readers(path, content)
    if not kernel.notify_resend():
        os.kill(first, signal.SIGKILL)
        serving_pid(mount, other_than=first)
        assert_mount_given_up(mount, readers, mount_id, content)
        return
    try:
        pid, rng = first, random.Random(3)
        for _ in range(5):
            time.sleep(rng.uniform(0.2, 1.0))
            os.kill(pid, signal.SIGKILL)
            pid = serving_pid(mount, other_than=pid)
            readers.read_on()
    finally:
        reads = readers.finish()
    assert readers.failures == [], readers.failures[:5]
    assert reads > 100
    status = mount.client.status().answer
    assert status['took_over_mount'] and status['pid'] != first
    assert os.stat(mount.mountpoint).st_dev == mount_id
    # Served from the boot image again, and new opens too.
    assert mount.client.stats(NAME)[NAME]['bytes_memory'] > 0
    assert path.read_bytes() == content


def test_files_served_by_the_kernel_outlive_a_restart(mount_factory, base_dir, content):
    """Passthrough opens are the kernel's own: they read on while yolofs is down and after; the
    next open by name gets an inode of the new yolofs."""
    mount = mount_factory(base_dir, kept=True, attr_timeout_secs=60)
    path = mount.mountpoint / NAME
    if not kernel.fuse_passthrough():
        # Before Linux 6.9 yolofs serves every file itself, and a restart gives the mount up.
        assert not mount.client.status().answer['kernel_passthrough']
        mount_id = os.stat(mount.mountpoint).st_dev
        readers = Readers(path, content, count=1)
        pid = serving_pid(mount)
        os.kill(pid, signal.SIGKILL)
        serving_pid(mount, other_than=pid)
        assert_mount_given_up(mount, readers, mount_id, content)
        return
    held = os.open(path, os.O_RDONLY)
    try:
        assert mount.client.status().answer['kernel_passthrough']
        old_ino = os.fstat(held).st_ino
        pid = serving_pid(mount)
        os.kill(pid, signal.SIGKILL)
        assert os.pread(held, 1 << 20, 5 << 20) == content[5 << 20:6 << 20]
        serving_pid(mount, other_than=pid)
        assert path.read_bytes() == content
        assert os.stat(path).st_ino != old_ino
        assert os.pread(held, 4096, SIZE - 4096) == content[-4096:]
    finally:
        os.close(held)


def test_sighup_to_the_keeper_restarts_yolofs_on_the_same_mount(
        mount_factory, base_dir, boot_image_dir, content):
    """How yolofs is upgraded under its guests: SIGHUP (systemctl reload)."""
    mount = mount_factory(base_dir, boot_images=boot_image_dir, kept=True)
    mount_id = os.stat(mount.mountpoint).st_dev
    readers = Readers(mount.mountpoint / NAME, content, count=2)
    if not kernel.notify_resend():
        pid = serving_pid(mount)
        mount.process.send_signal(signal.SIGHUP)
        serving_pid(mount, other_than=pid)
        assert_mount_given_up(mount, readers, mount_id, content)
        return
    try:
        pid = serving_pid(mount)
        mount.process.send_signal(signal.SIGHUP)
        serving_pid(mount, other_than=pid)
        readers.read_on()
    finally:
        readers.finish()
    assert readers.failures == [] and mount.client.status().answer['took_over_mount']


def test_sigterm_to_the_keeper_unmounts_and_ends_it(mount_factory, base_dir):
    mount = mount_factory(base_dir, kept=True)
    os.kill(serving_pid(mount), signal.SIGKILL)
    serving_pid(mount, other_than=None)
    mountpoint = mount.mountpoint
    assert mount.stop() == 0
    assert not yolofs.is_mounted(mountpoint)


class ServiceManager:
    """systemd's side of the protocol the keeper speaks upwards (sd_notify(3), FDSTORE=1 and
    LISTEN_FDS), for a keeper that is itself killed: what it held comes back to the next one."""

    def __init__(self, path):
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.bind(str(path))
        self.path = path
        self.stored = {}

    def receive(self, timeout=30):
        self.socket.settimeout(timeout)
        message, fds, _, _ = socket.recv_fds(self.socket, 4096, 8)
        fields = dict(line.split('=', 1) for line in message.decode().splitlines())
        if fields.get('FDSTORE') == '1':
            self.stored[fields['FDNAME']] = fds[0]
        if fields.get('FDSTOREREMOVE') == '1' and fields['FDNAME'] in self.stored:
            os.close(self.stored.pop(fields['FDNAME']))
        return fields

    def start(self, command, log):
        """Runs `command` as systemd would with its store: LISTEN_FDS from 3, LISTEN_PID its own."""
        fds = list(self.stored.values())
        env = dict(os.environ, NOTIFY_SOCKET=str(self.path))
        if fds:
            env.update(LISTEN_FDS=str(len(fds)), LISTEN_FDNAMES=':'.join(self.stored))
        # Moved ("N<&M-": the number it had is closed), so that the child holds each once, at
        # its number from 3, as systemd passes them.
        moves = ' '.join('%d<&%d-' % (3 + i, fd) if fd != 3 + i else ''
                         for i, fd in enumerate(fds))
        # bash, not sh: dash takes only one-digit descriptors in redirections.
        shell = ['bash', '-c', 'LISTEN_PID=$$ exec "$@" %s' % moves, 'bash']
        return subprocess.Popen(shell + command, env=env, pass_fds=fds, stdout=log,
                                stderr=subprocess.STDOUT)


def test_a_killed_keeper_gets_the_mount_back_from_the_service_manager(
        base_dir, boot_image_dir, content, tmp_path):
    manager = ServiceManager(tmp_path / 'notify')
    mount = yolofs.Mount(base_dir, tmp_path / 'mnt', boot_image_dir, tmp_path / 'control.sock',
                         kept=True)
    mount.mountpoint.mkdir()
    log = open(tmp_path / 'keeper.log', 'ab')
    keeper = manager.start(mount.command(), log)
    try:
        while 'READY' not in manager.receive():
            pass
        assert 'yolofs-fuse' in manager.stored
        # A first close: the kernel learns that yolofs has no flush (ENOSYS) and never waits for
        # it again in close(2), which the harness's fork would while no yolofs runs.
        assert (mount.mountpoint / NAME).read_bytes() == content
        mount_id = os.stat(mount.mountpoint).st_dev
        readers = Readers(mount.mountpoint / NAME, content, count=2)
        try:
            child = serving_pid(mount)
            # As systemd stops what is left of a service whose main process died (KillMode=mixed).
            keeper.kill()
            keeper.wait()
            os.kill(child, signal.SIGKILL)
            keeper = manager.start(mount.command(), log)
            serving_pid(mount, other_than=child)
            if not kernel.notify_resend():
                # The new yolofs gives the old mount up: its keeper has the service manager
                # drop the old descriptor, which ends the old mount's connection.
                while 'yolofs-fuse' in manager.stored:
                    manager.receive()
                assert_mount_given_up(mount, readers, mount_id, content)
                return
            readers.read_on()
        finally:
            readers.finish()
        assert readers.failures == []
        assert mount.client.status().answer['took_over_mount']
    finally:
        keeper.terminate()
        keeper.wait(30)
        for fd in manager.stored.values():
            os.close(fd)
    assert not yolofs.is_mounted(mount.mountpoint)


def test_the_keeper_does_not_restart_a_yolofs_that_never_mounted(tmp_path):
    keeper = subprocess.run([yolofs.binary(), 'keep', '--', yolofs.binary(), 'mount',
                             '--source', tmp_path, '--mountpoint', tmp_path / 'mnt',
                             '--boot-images', tmp_path / 'store', '--metrics-address', 'bad'],
                            capture_output=True, text=True, timeout=30)
    assert keeper.returncode == 2, keeper.stderr
    assert 'restart' not in keeper.stderr


def test_a_second_yolofs_does_not_replace_a_live_one(mount_factory, base_dir, content, tmp_path):
    live = mount_factory(base_dir)
    second = yolofs.Mount(base_dir, live.mountpoint, tmp_path / 'boot-images', live.control_socket)
    refused = subprocess.run(second.command(), capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1
    assert 'already running' in refused.stderr
    assert (live.mountpoint / NAME).read_bytes() == content
    assert live.client.status()


def test_ctl_command_line(mount_factory, base_dir, boot_image_dir):
    mount = mount_factory(base_dir, boot_images=boot_image_dir)
    out = yolofs.run('ctl', '--socket', mount.control_socket, 'preload', NAME).stdout
    assert '"ok": true' in out
    proc = yolofs.run('ctl', '--socket', mount.control_socket, 'record-stop', NAME, check=False)
    assert proc.returncode != 0 and 'not learning' in proc.stderr


def scrape(mount):
    """The mount's metrics; its --metrics-address had port 0, the log says which it got."""
    log = mount.log_path.read_text()
    return prometheus.scrape(re.search(r'metrics on (http://\S+)', log).group(1))


def status_memory(mount):
    return mount.client.status().answer['memory_used_bytes']


def test_metrics_count_what_was_served(mount_factory, base_dir, boot_image_dir, content):
    shutil.copy(base_dir / NAME, base_dir / 'other')
    data = bytearray((boot_image_dir / (NAME + '.yolo')).read_bytes())
    data[len(data) // 2] ^= 0x10
    (boot_image_dir / 'other.yolo').write_bytes(bytes(data))
    mount = mount_factory(base_dir, boot_images=boot_image_dir, mlock=True,
                          no_kernel_passthrough=True, metrics_address='127.0.0.1:0')
    assert (mount.mountpoint / NAME).read_bytes() == content
    assert (mount.mountpoint / 'other').read_bytes() == content
    with pytest.raises(FileNotFoundError):
        os.stat(mount.mountpoint / 'missing')

    metrics = scrape(mount)
    stats = mount.client.stats()
    for name in (NAME, 'other'):
        for source, counted in (('boot_image', 'bytes_memory'), ('base_file', 'bytes_passthrough')):
            key = ('yolofs_read_bytes_total', (('file', name), ('from', source), ('image', '')))
            assert metrics[key] == stats[name][counted], key
    assert metrics[('yolofs_read_bytes_total',
                    (('file', NAME), ('from', 'boot_image'), ('image', '')))] > 0
    assert metrics[('yolofs_read_bytes_total',
                    (('file', 'other'), ('from', 'boot_image'), ('image', '')))] == 0
    # Every read timed, by where it was served from; none in flight now.
    requests = {source: sum(stats[name][counted] for name in (NAME, 'other'))
                for source, counted in (('boot_image', 'requests_memory'),
                                        ('base_file', 'requests_passthrough'),
                                        ('mixed', 'requests_mixed'))}
    for source, count in requests.items():
        assert metrics[('yolofs_read_seconds_count', (('from', source),))] == count, source
    assert requests['boot_image'] > 0 and requests['base_file'] > 0
    assert metrics[('yolofs_read_seconds_bucket', (('from', 'boot_image'), ('le', '+Inf')))] \
        == requests['boot_image']
    assert metrics[('yolofs_read_seconds_count', (('from', 'fill'),))] == 0
    assert metrics[('yolofs_reads_in_flight', ())] == 0
    assert metrics[('yolofs_oldest_read_in_flight_seconds', ())] == 0
    assert metrics[('yolofs_resident_memory_bytes', ())] > status_memory(mount)
    assert metrics[('yolofs_fills_in_progress', ())] == 0
    assert metrics[('yolofs_boot_image_loads_total', ())] == 1
    assert metrics[('yolofs_boot_image_rejections_total', (('reason', 'invalid'),))] == 1
    assert metrics[('yolofs_boot_images_refused', ())] == 1
    status = mount.client.status().answer
    assert metrics[('yolofs_memory_used_bytes', ())] == status['memory_used_bytes'] > 0
    # Locked: the pool's slabs that hold the boot image, whole (2 MiB each).
    locked = metrics[('yolofs_memory_locked_bytes', ())]
    assert locked == status['block_pool']['locked_bytes'] >= status['memory_used_bytes']
    assert locked % (2 << 20) == 0
    assert metrics[('yolofs_fuse_errors_total',
                    (('errno', str(errno.ENOENT)), ('operation', 'lookup')))] >= 1
    assert 0 <= metrics[('yolofs_host_io_utilisation', ())] <= 1
    assert metrics[('yolofs_up', ())] == 1
    url = re.search(r'metrics on (http://\S+)/metrics', mount.log_path.read_text()).group(1)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url + '/other', timeout=10)
    assert err.value.code == 404


def test_metrics_count_learning_windows(mount_factory, base_dir, tmp_path):
    mount = mount_factory(base_dir, boot_images=tmp_path / 'learned', learn=True,
                          no_kernel_passthrough=True, metrics_address='127.0.0.1:0')
    with open(mount.mountpoint / NAME, 'rb') as f:
        f.read(1 << 20)
        assert scrape(mount)[('yolofs_learning_windows_open', ())] == 1
        mount.client.record_stop(NAME)
    metrics = scrape(mount)
    assert metrics[('yolofs_learning_windows_total', (('outcome', 'started'),))] == 1
    assert metrics[('yolofs_learning_windows_total', (('outcome', 'learned'),))] == 1
    assert metrics[('yolofs_learning_windows_open', ())] == 0


def test_a_boot_image_learned_from_a_window_that_closed_early_heals_at_the_next_boot(
        mount_factory, base_dir, content, tmp_path):
    mount = mount_factory(base_dir, boot_images=tmp_path / 'learned', learn=True,
                          record_idle_secs=1, no_kernel_passthrough=True)
    early, late = [(0, 1 << 20)], [(8 << 20, 1 << 20)]
    # The first boot pauses longer than the idle gap: the window closes before it reads `late`.
    fd = os.open(mount.mountpoint / NAME, os.O_RDONLY | os.O_DIRECT)
    try:
        os.preadv(fd, [mmap.mmap(-1, 1 << 20)], 0)
        wait_for(lambda: NAME in mount.client.status().boot_images)
        os.preadv(fd, [mmap.mmap(-1, 1 << 20)], 8 << 20)
    finally:
        os.close(fd)
    # Ending a window that already ended is not an error.
    answer = mount.client.record_stop(NAME)
    assert answer['built'] is True and answer['window_was_open'] is False
    assert served(mount, early + late, read_direct) == expected(content, early + late)
    wait_for(lambda: mount.client.stats(NAME)[NAME]['boots'])
    second = mount.client.stats(NAME)[NAME]['boots'][0]
    assert second['partial'] is True and second['bytes_passthrough'] == 1 << 20, second
    assert second['extended_bytes'] > 0, second
    # The third boot is served from the extended boot image.
    assert served(mount, early + late, read_direct) == expected(content, early + late)
    wait_for(lambda: len(mount.client.stats(NAME)[NAME]['boots']) == 2)
    third = mount.client.stats(NAME)[NAME]['boots'][1]
    assert third['coverage'] == 1.0 and third['partial'] is False, third
    assert third['bytes_memory'] == 2 << 20


def test_a_taken_metrics_address_fails_the_mount(mount_factory, base_dir, tmp_path):
    first = mount_factory(base_dir, metrics_address='127.0.0.1:0')
    taken = re.search(r'metrics on http://(\S+)/metrics', first.log_path.read_text()).group(1)
    with pytest.raises(yolofs.YolofsError, match='exited'):
        mount_factory(base_dir, metrics_address=taken)
    assert 'metrics address %s' % taken in (tmp_path / 'yolofs1.log').read_text()


def test_ctl_says_when_no_yolofs_runs(tmp_path):
    proc = yolofs.run('ctl', '--socket', tmp_path / 'none.sock', 'status', check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        'yolofs: error: no yolofs is running with control socket %s (nothing listens there; '
        '--socket names another)' % (tmp_path / 'none.sock'))


def test_pin_locks_qemu_files(tmp_path):
    listed = yolofs.run('pin', '--list').stdout.split()
    qemu = os.path.realpath(shutil.which('qemu-system-x86_64'))
    assert qemu in listed
    assert any('libc.so' in path for path in listed)
    assert any('bios' in path for path in listed)
    proc = subprocess.Popen([yolofs.binary(), 'pin'], stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith('pinned'):
                break
        with open('/proc/%d/status' % proc.pid) as f:
            locked_kib = int(next(line for line in f if line.startswith('VmLck:')).split()[1])
        assert locked_kib * 1024 >= os.path.getsize(qemu)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0


def test_mount_waits_for_novas_image_cache_to_exist(tmp_path):
    # yolofs never makes Nova's directories: before Nova caches its first image, _base does not
    # exist, and yolofs waits for it rather than failing (or making it as root).
    source = tmp_path / 'instances' / '_base'
    mountpoint = tmp_path / 'mnt'
    mountpoint.mkdir()
    process = subprocess.Popen(
        [yolofs.binary(), 'mount', '--source', str(source), '--mountpoint', str(mountpoint),
         '--boot-images', str(tmp_path / 'boot-images'),
         '--control-socket', str(tmp_path / 'control.sock')],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=2)
        assert not os.path.ismount(mountpoint) and not source.exists()
        source.mkdir(parents=True)
        (source / 'base').write_bytes(b'x' * 4096)
        deadline = time.monotonic() + 30
        while not os.path.ismount(mountpoint):
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        assert (mountpoint / 'base').read_bytes() == b'x' * 4096
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=30)[0]
    assert 'waiting for %s to exist' % source in output


def offered_fill(base_dir, boot_image_dir, tmp_path):
    """The boot image of the base file moved out of the store (a client offers it), an empty
    fill file of the base file's size, the boot image's extents and the holes between them."""
    offered = tmp_path / 'offered.yolo'
    shutil.move(boot_image_dir / (NAME + '.yolo'), offered)
    fill_name = NAME + '.yolo-fill'
    with open(base_dir / fill_name, 'wb') as f:
        f.truncate(SIZE)
    extents = boot_image_extents(offered)
    holes = holes_between(extents, SIZE)
    assert len(holes) >= 2
    return offered, fill_name, extents, holes


def boot_image_extents(path):
    return json.loads(yolofs.run('inspect', '--json', '--extents', path).stdout)['extents']


def holes_between(extents, size):
    """The (offset, length) ranges of a file of ``size`` bytes no extent covers."""
    holes, cursor = [], 0
    for extent in extents:
        if extent['source_offset'] > cursor:
            holes.append((cursor, extent['source_offset'] - cursor))
        cursor = max(cursor, extent['source_offset'] + extent['length'])
    if cursor < size:
        holes.append((cursor, size - cursor))
    return holes


def test_a_base_file_being_filled_is_served_before_it_is_complete(
        mount_factory, base_dir, boot_image_dir, content, tmp_path):
    """A fill file (docs/first-boot.md): sparse at its final size, served at once from its boot
    image; a read of a hole waits until the fill writes it and says so (its want), one that
    waits too long fails with EIO; complete, the boot image is compared with the data and the
    file is read through the mount as it is renamed to its base file name."""
    offered, fill_name, extents, holes = offered_fill(base_dir, boot_image_dir, tmp_path)
    (base_dir / NAME).unlink()
    mount = mount_factory(base_dir, boot_images=tmp_path / 'empty-store',
                          fill_read_timeout_secs=5, metrics_address='127.0.0.1:0')
    answer = mount.client.fill_begin(fill_name, offered, 'some-image-id')
    assert answer.new and answer.size == SIZE and answer.filled_bytes == 0
    assert mount.client.status().answer['fills'] == [
        {'file': fill_name, 'size': SIZE, 'filled_bytes': 0}]
    assert scrape(mount)[('yolofs_fill_size_bytes', (('file', fill_name),))] == SIZE
    extent = extents[0]
    served = mount.mountpoint / fill_name
    fd = os.open(served, os.O_RDONLY)
    try:
        start, length = extent['source_offset'], extent['length']
        assert os.pread(fd, length, start) == content[start:start + length]
        # Labelled with the image being filled, before its base file exists.
        assert scrape(mount)[('yolofs_read_bytes_total', (
            ('file', fill_name), ('from', 'boot_image'), ('image', 'some-image-id')))] >= length

        with pytest.raises(OSError) as hole:
            os.pread(fd, holes[0][1], holes[0][0])
        assert hole.value.errno == errno.EIO

        fill = open(base_dir / fill_name, 'r+b')
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            start, size = holes[1][0], holes[1][1] + (1 << 20)
            reading = pool.submit(os.pread, fd, size, start)
            # A read waiting for the fill shows in the metrics while it waits.
            deadline = time.monotonic() + 4
            while scrape(mount)[('yolofs_oldest_read_in_flight_seconds', ())] < 0.1:
                assert time.monotonic() < deadline and not reading.done()
            assert scrape(mount)[('yolofs_reads_in_flight', ())] >= 1
            wants = []
            while not reading.done():
                for offset, length in mount.client.fill_wants(fill_name, 0.5):
                    fill.seek(offset)
                    fill.write(content[offset:offset + length])
                    fill.flush()
                    mount.client.fill_done(fill_name, offset, length)
                    wants.append((offset, length))
            assert reading.result() == content[start:start + size]
        assert wants

        fill.seek(0)
        fill.write(content)
        fill.close()
        mount.client.fill_done(fill_name, 0, SIZE)
        metrics = scrape(mount)
        assert metrics[('yolofs_fills_in_progress', ())] == 1
        assert metrics[('yolofs_fill_filled_bytes', (('file', fill_name),))] == SIZE
        # The extent, the hole waited for (FUSE requests of at most max_read bytes each); the
        # hole that timed out failed.
        assert metrics[('yolofs_read_seconds_count', (('from', 'fill'),))] >= 2
        assert metrics[('yolofs_read_seconds_count', (('from', 'error'),))] >= 1
        assert metrics[('yolofs_read_seconds_bucket', (('from', 'error'), ('le', '0.5')))] == 0
        assert mount.client.fill_end(fill_name, complete=True).boot_image_matches is True
        assert mount.client.status().answer['fills'] == []
        os.rename(base_dir / fill_name, base_dir / NAME)
        assert os.pread(fd, SIZE, 0) == content
        assert (mount.mountpoint / NAME).read_bytes() == content
    finally:
        os.close(fd)


def test_a_failed_fill_or_a_boot_image_of_other_data_never_serves_a_wrong_byte(
        mount_factory, base_dir, boot_image_dir, content, tmp_path):
    offered, fill_name, _, holes = offered_fill(base_dir, boot_image_dir, tmp_path)
    mount = mount_factory(base_dir, boot_images=tmp_path / 'empty-store',
                          fill_read_timeout_secs=30)
    mount.client.fill_begin(fill_name, offered, 'some-image-id')
    fd = os.open(mount.mountpoint / fill_name, os.O_RDONLY)
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            reading = pool.submit(os.pread, fd, holes[-1][1], holes[-1][0])
            while not mount.client.fill_wants(fill_name, 0.5):
                pass
            mount.client.fill_end(fill_name, complete=False, reason='glance unreachable')
            with pytest.raises(OSError) as failed:
                reading.result()
            assert failed.value.errno == errno.EIO
    finally:
        os.close(fd)

    # Other data than the boot image's: the fill completes (its data was verified) and the
    # boot image is reported not to match it, then never served again.
    other = bytes(b ^ 0xff for b in content)
    (base_dir / fill_name).write_bytes(other)
    mount.client.fill_begin(fill_name, offered, 'some-image-id')
    fd = os.open(mount.mountpoint / fill_name, os.O_RDONLY | os.O_DIRECT)
    try:
        mount.client.fill_done(fill_name, 0, SIZE)
        ended = mount.client.fill_end(fill_name, complete=True)
        assert ended.boot_image_matches is False and 'differs' in ended.mismatch
        buf = mmap.mmap(-1, SIZE)
        assert os.preadv(fd, [buf], 0) == SIZE and bytes(buf) == other
    finally:
        os.close(fd)


def test_the_end_of_a_fill_compares_no_file_a_link_names(
        mount_factory, base_dir, boot_image_dir, content, tmp_path):
    """A complete fill's boot image is compared with the fill file as install opens a file: a
    link put in its place (to a file the client may not read) is refused, and nothing of the
    file it names is told."""
    offered, fill_name, _, _ = offered_fill(base_dir, boot_image_dir, tmp_path)
    mount = mount_factory(base_dir, boot_images=tmp_path / 'empty-store')
    mount.client.fill_begin(fill_name, offered, 'some-image-id')
    secret = tmp_path / 'root-only'
    secret.write_bytes(content)
    secret.chmod(0o600)
    (base_dir / fill_name).unlink()
    (base_dir / fill_name).symlink_to(secret)
    with pytest.raises(yolofs.YolofsError, match='is a symbolic link') as refused:
        mount.client.fill_end(fill_name, complete=True)
    assert 'differs' not in str(refused.value) and 'match' not in str(refused.value)
