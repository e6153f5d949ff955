"""Where the benchmark keeps base files and instance disks: the machine's own disk, or an
emulated HDD.

The emulated HDD is an ext4 filesystem on a loop device (direct I/O to its backing file, so the
host page cache does not stand in front of it twice), throttled by the cgroup-v1 blkio controller
to the figures of the thesis' HDD. Throttling applies to the I/O of the processes in the cgroup,
and all of them share one budget, as they would share one disk: every process that touches the
disk during a run (QEMU, yolofs, fio stressors) is started inside it.
"""

import dataclasses
import os
import pathlib
import subprocess

BLKIO = pathlib.Path('/sys/fs/cgroup/blkio')


@dataclasses.dataclass(frozen=True)
class DiskLimits:
    """Throughput and operation rates of the emulated disk (the thesis' 10k rpm HDD)."""
    read_bps: int = 150 * 10**6
    write_bps: int = 150 * 10**6
    read_iops: int = 300
    write_iops: int = 300


class LocalDisk:
    """The machine's own disk: a directory, no throttling."""

    name = 'local'

    def __init__(self, root):
        self.root = pathlib.Path(root)

    def setup(self):
        self.root.mkdir(parents=True, exist_ok=True)
        return self

    def teardown(self):
        pass

    def join_cgroup(self):
        """preexec_fn for processes doing this disk's I/O (nothing to join here)."""

    def describe(self):
        return 'the machine\'s own disk, unthrottled (%s)' % self.root


class ThrottledDirectory(LocalDisk):
    """A directory on a disk that a blkio cgroup set up elsewhere throttles (the all-in-one's
    emulated HDDs, ``AIO_COMPUTE_DISK=hdd``): processes doing its I/O join that cgroup, sharing
    the disk's budget with the host's guests and yolofs."""

    name = 'hdd'

    def __init__(self, root, cgroup):
        super().__init__(root)
        self.cgroup = pathlib.Path(cgroup)

    def join_cgroup(self):
        """preexec_fn: moves the starting child process into the throttled cgroup."""
        (self.cgroup / 'cgroup.procs').write_text(str(os.getpid()))

    def describe(self):
        return '%s, on a disk throttled by blkio cgroup %s' % (self.root, self.cgroup)


class ThrottledDisk(ThrottledDirectory):
    """An emulated HDD: ext4 on a loop device throttled by a blkio cgroup, both of its own."""

    def __init__(self, root, size_gib=24, limits=DiskLimits(), cgroup=None):
        self.root = pathlib.Path(root)
        self.image = self.root.parent / (self.root.name + '.img')
        self.size_gib = size_gib
        self.limits = limits
        # One cgroup per benchmark process: two runs never share (or tear down) a throttle.
        self.cgroup = BLKIO / (cgroup or 'yolo-hdd-%d' % os.getpid())
        self.loop = None

    def setup(self):
        if not (BLKIO / 'blkio.throttle.read_iops_device').exists():
            raise RuntimeError('the cgroup-v1 blkio controller is not mounted at %s' % BLKIO)
        self.teardown()
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.image, 'wb') as f:
            f.truncate(self.size_gib << 30)
        self.loop = run('losetup', '--find', '--show', '--direct-io=on',
                        str(self.image)).strip()
        run('mkfs.ext4', '-q', '-F', '-E', 'lazy_itable_init=0,lazy_journal_init=0',
            self.loop)
        run('mount', self.loop, str(self.root))
        self.cgroup.mkdir(exist_ok=True)
        device = '%d:%d' % _major_minor(self.loop)
        for name, value in (('read_bps', self.limits.read_bps),
                            ('write_bps', self.limits.write_bps),
                            ('read_iops', self.limits.read_iops),
                            ('write_iops', self.limits.write_iops)):
            (self.cgroup / ('blkio.throttle.%s_device' % name)).write_text(
                '%s %d\n' % (device, value))
        return self

    def teardown(self):
        if _is_mountpoint(self.root):
            run('umount', str(self.root))
        for line in run('losetup', '--list', '--noheadings', '--output',
                        'NAME,BACK-FILE').splitlines():
            name, _, backing = line.strip().partition(' ')
            if backing.strip() == str(self.image):
                run('losetup', '-d', name)
        self.loop = None
        if self.cgroup.exists():
            for pid in (self.cgroup / 'cgroup.procs').read_text().split():
                try:
                    (BLKIO / 'cgroup.procs').write_text(pid)
                except OSError:
                    pass  # gone already
            self.cgroup.rmdir()
        if self.image.exists():
            self.image.unlink()

    def describe(self):
        lim = self.limits
        return ('an emulated HDD: ext4 on a loop device throttled by cgroup-v1 blkio to %d MB/s '
                'and %d IOPS for reads, %d MB/s and %d IOPS for writes' % (
                    lim.read_bps // 10**6, lim.read_iops, lim.write_bps // 10**6,
                    lim.write_iops))


def run(*cmd):
    """Runs a command, failing on a non-zero exit; returns its standard output."""
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def write_random(path, mib):
    """A file of ``mib`` MiB of random bytes (incompressible, nothing shared with other files)."""
    with open(path, 'wb') as f:
        subprocess.run(['head', '-c', str(mib << 20), '/dev/urandom'], stdout=f, check=True)


def _major_minor(device):
    rdev = os.stat(device).st_rdev
    return os.major(rdev), os.minor(rdev)


def _is_mountpoint(path):
    return pathlib.Path(path).is_dir() and os.path.ismount(path)
