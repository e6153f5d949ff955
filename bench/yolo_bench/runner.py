"""Running the planned boots for real.

Per storage, once: the test image is converted to raw as Nova does into ``_base`` on that storage
(one copy per distinct image needed), a boot image is learned from one boot (on the machine's
own disk, not timed) and built for every copy from the same trace, and a yolofs mount of ``_base``
is started inside the storage's cgroup (its reads of the base files share the disk with everyone).
Boot images live on the machine's own disk, the "fast local storage" of the design.

Per run: the page cache is dropped (cold, as the thesis measured), the policy's preparation is
done (warm: the base files read into page cache; yolo: boot images reloaded from the store and
locked; yolo-unlocked: the same through a second mount that does not lock them; yolo+pin: QEMU's
files pinned), stressors or memory pressure are started, then all the run's guests are started at
once, each with a fresh qcow2 overlay on the storage, and the time to
the guest's ready pattern (the test image's "sshd started" marker by default) is taken for each.
QEMU uses the run's cache mode: writethrough, the thesis' (the page cache is on the read path as
it was there), or none, Nova's wherever O_DIRECT works (the page cache is bypassed, and a warm one
cannot help).
"""

import contextlib
import os
import pathlib
import shutil
import subprocess
import sys
import time
import uuid

from yolo_bench.results import Result
from yolo_common import images
from yolo_common import learning
from yolo_common import qemu
from yolo_common import yolofs
from yolo_testing import storage as storage_mod
from yolo_testing.stressors import io_stressors
from yolo_testing.stressors import stressor_file
from yolo_testing.stressors import STRESSOR_FILE_MIB

BOOT_TIMEOUT = 1800
LEARNING_CACHE_MODE = 'writethrough'
GUEST_MEMORY_MIB = 512


def log(message):
    print('==> %s %s' % (time.strftime('%H:%M:%S'), message), flush=True)


class StorageSession:
    """Everything one storage needs for its runs: base files, boot images, the yolofs mount."""

    def __init__(self, disk, work, test_image, image_count, learned, stressors=0,
                 memory_pressure=False, ready_marker=qemu.READY_MARKER):
        self.disk = disk
        self.work = pathlib.Path(work)
        self.test_image = test_image
        self.image_count = image_count
        self.learned = learned           # (trace path) of a boot learned on the local disk
        self.ready_marker = ready_marker
        self.base_dir = disk.root / '_base'
        self.disk_dir = disk.root / 'instances'
        self.store = self.work / ('store-' + disk.name)
        self.bases = []
        self.mount = None
        self.unlocked_mount = None
        self.stressors = stressors
        # Swap lives on the storage under test: on the emulated HDD, what is paged out comes back
        # at that disk's speed, sharing its budget.
        self.swap = disk.root / 'swapfile' if memory_pressure else None

    def __enter__(self):
        self.disk.setup()
        for path in (self.base_dir, self.disk_dir, self.store):
            path.mkdir(parents=True, exist_ok=True)
        first = self.base_dir / images.base_file_name(str(uuid.uuid4()))
        log('%s: converting the test image to raw in %s' % (self.disk.name, self.base_dir))
        images.convert_to_raw(self.test_image, first)
        self.bases = [first]
        for _ in range(1, self.image_count):
            copy = self.base_dir / images.base_file_name(str(uuid.uuid4()))
            subprocess.run(['cp', '--sparse=always', str(first), str(copy)], check=True)
            self.bases.append(copy)
        for i in range(self.stressors):
            # Written now, outside the throttled cgroup, so no run pays for laying them out.
            storage_mod.write_random(stressor_file(self.disk, i), STRESSOR_FILE_MIB)
        for base in self.bases:
            # Same bytes, same boot: one trace serves every copy; --mark records the verification.
            yolofs.run('build', '--trace', self.learned, '--source', base,
                       '--output', self.store / (base.name + '.yolo'), '--mark')
        self.mount = self._mount('', mlock=True)
        if self.swap:
            # Without swap, anonymous memory is never reclaimed and locking changes nothing.
            storage_mod.run('fallocate', '-l', '%dG' % SWAP_GIB, str(self.swap))
            self.swap.chmod(0o600)
            storage_mod.run('mkswap', str(self.swap))
            storage_mod.run('swapon', str(self.swap))
            self.unlocked_mount = self._mount('-unlocked', mlock=False)
        return self

    def _mount(self, suffix, mlock):
        name = self.disk.name + suffix
        return yolofs.Mount(
            source=self.base_dir, mountpoint=self.work / ('mnt-' + name),
            boot_images=self.store, control_socket=self.work / ('ctl-%s.sock' % name),
            log_path=self.work / ('yolofs-%s.log' % name),
            preexec_fn=self.disk.join_cgroup, mlock=mlock, no_kernel_passthrough=True,
            memory_budget_mib=4096).start()

    def __exit__(self, *exc):
        for mount in (self.mount, self.unlocked_mount):
            if mount:
                mount.stop()
        if self.swap and self.swap.exists():
            subprocess.run(['swapoff', str(self.swap)], capture_output=True)
            self.swap.unlink()
        self.disk.teardown()

    def mount_for(self, policy):
        return self.unlocked_mount if policy == 'yolo-unlocked' else self.mount

    def backing_for(self, base, policy):
        if policy.startswith('yolo'):
            return self.mount_for(policy).mountpoint / base.name
        return base

    def prepare(self, point):
        """Puts caches and boot images in the state the policy starts from."""
        qemu.drop_caches()
        bases = self.bases[:point.distinct_images]
        if point.policy == 'warm':
            for base in bases:
                subprocess.run(['cat', str(base)], stdout=subprocess.DEVNULL, check=True)
        if point.policy.startswith('yolo'):
            client = self.mount_for(point.policy).client
            for base in bases:
                client.evict(base.name)
                client.preload(base.name)


@contextlib.contextmanager
def pinned_qemu(enabled):
    """`yolofs pin` holding QEMU's files in page cache for the duration (yolo+pin)."""
    if not enabled:
        yield
        return
    proc = subprocess.Popen([yolofs.binary(), 'pin'], stdout=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith('pinned'):
                break
        yield
    finally:
        proc.terminate()
        proc.wait(30)


SWAP_GIB = 4

# Takes MiB of memory given as argument, writing every page, says "ready", then holds it.
MEMORY_HOG = """
import mmap, sys
size = int(sys.argv[1]) << 20
chunk = b'\\1' * (64 << 20)
memory = mmap.mmap(-1, size)
for _ in range(size // len(chunk)):
    memory.write(chunk)
print('ready', flush=True)
sys.stdin.read()
"""


PAGE_SIZE = os.sysconf('SC_PAGE_SIZE')


def _proc_number(path, name):
    """The number after ``name`` in a /proc key-value file (/proc/meminfo, /proc/vmstat)."""
    with open(path) as f:
        for line in f:
            fields = line.split()
            if fields[0].rstrip(':') == name:
                return int(fields[1])
    raise RuntimeError('no %s in %s' % (name, path))


def _pages_swapped_in():
    return _proc_number('/proc/vmstat', 'pswpin')


def _mem_available_mib():
    return _proc_number('/proc/meminfo', 'MemAvailable') // 1024


@contextlib.contextmanager
def memory_pressure(free_mib):
    """A process holding all available memory but ``free_mib`` MiB (None: no pressure)."""
    if free_mib is None:
        yield
        return
    hog_mib = max(0, _mem_available_mib() - free_mib)
    proc = subprocess.Popen([sys.executable, '-c', MEMORY_HOG, str(hog_mib)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if proc.stdout.readline().strip() != 'ready':
            raise RuntimeError('the memory hog did not start (exit %s)' % proc.poll())
        yield
    finally:
        proc.kill()
        proc.wait()


def run_boots(session, point, console_dir):
    """Boots ``point.boots`` guests at once; returns their boot times (ms) and, per guest, QEMU's
    CPU seconds and its vCPU's running and run-queue seconds at ready."""
    overlays, guests = [], []
    try:
        for i in range(point.boots):
            base = session.bases[i % point.distinct_images]
            overlay = session.disk_dir / ('vm%d.qcow2' % i)
            images.create_overlay(session.backing_for(base, point.policy), overlay)
            overlays.append(overlay)
        for i, overlay in enumerate(overlays):
            guests.append(qemu.Guest(
                overlay, cache=point.cache, memory_mib=GUEST_MEMORY_MIB,
                ready_marker=session.ready_marker, console_log=console_dir / ('vm%d.log' % i),
                preexec_fn=session.disk.join_cgroup).start())
        times = [round(guest.wait_ready(BOOT_TIMEOUT) * 1000) for guest in guests]
        return times, [(guest.cpu_at_ready, *guest.vcpu_at_ready) for guest in guests]
    finally:
        for guest in guests:
            guest.stop()
        for overlay in overlays:
            overlay.unlink(missing_ok=True)


def measure(session, run, console_dir):
    point = run.point
    session.prepare(point)
    with pinned_qemu(point.policy == 'yolo+pin'), \
            io_stressors(session.disk, point.size if point.scenario == 'contention' else 0), \
            memory_pressure(point.size if point.scenario == 'memory' else None):
        swapped_in = _pages_swapped_in()
        times, cpu = run_boots(session, point, console_dir)
        swapped_in = (_pages_swapped_in() - swapped_in) * PAGE_SIZE / (1 << 20)
    longest = max(range(len(times)), key=times.__getitem__)
    return Result(point, run.repetition, times[longest], tuple(times), *cpu[longest],
                  swapped_in_mib=swapped_in)


def learn_boot_image(test_image, work, ready_marker=qemu.READY_MARKER):
    """Learns the test image's boot trace from one boot on the machine's own disk."""
    base_dir = work / 'learn' / '_base'
    base_dir.mkdir(parents=True)
    base = base_dir / images.base_file_name(str(uuid.uuid4()))
    images.convert_to_raw(test_image, base)
    learned = learning.learn_boot_image(base, work / 'learn', boot_timeout=BOOT_TIMEOUT,
                                        cache=LEARNING_CACHE_MODE, ready_marker=ready_marker)
    trace = work / 'boot.trace'
    shutil.copy(learned.trace, trace)
    shutil.rmtree(work / 'learn')
    return trace


def make_disk(name, work):
    if name == 'local':
        return storage_mod.LocalDisk(work / 'local')
    return storage_mod.ThrottledDisk(work / 'hdd')
