"""The boot benchmark for real: the emulated HDD, and a short smoke run of every policy."""

import os
import subprocess

from yolo_bench import cli
from yolo_bench import plan
from yolo_bench import results
from yolo_testing import storage


def test_throttled_disk_accounts_io_to_its_cgroup(tmp_path):
    disk = storage.ThrottledDisk(tmp_path / 'hdd', size_gib=1,
                                 limits=storage.DiskLimits(read_iops=250, read_bps=10**8))
    disk.setup()
    try:
        limits = (disk.cgroup / 'blkio.throttle.read_iops_device').read_text()
        major, minor = storage._major_minor(disk.loop)
        assert limits.strip() == '%d:%d 250' % (major, minor)
        data = disk.root / 'data'
        data.write_bytes(os.urandom(4 << 20))
        subprocess.run(['sync'], check=True)
        subprocess.run(['dd', 'if=%s' % data, 'of=/dev/null', 'bs=64k', 'iflag=direct'],
                       check=True, capture_output=True, preexec_fn=disk.join_cgroup)
        serviced = (disk.cgroup / 'blkio.throttle.io_serviced').read_text()
        reads = [line for line in serviced.splitlines()
                 if line.startswith('%d:%d Read' % (major, minor))]
        # 4 MiB in 64 KiB direct reads: 64 requests went through the throttled cgroup.
        assert reads and int(reads[0].split()[-1]) >= 64, serviced
    finally:
        disk.teardown()
    assert not disk.cgroup.exists()
    assert not disk.image.exists()
    assert not os.path.ismount(disk.root)


def test_smoke_run_of_every_policy(tmp_path, tiny_image):
    """With Nova's cache mode (the thesis' is the learning boot's), the ready pattern given as a
    regular expression."""
    csv = tmp_path / 'boot.csv'
    cli.main(['run', '--scenario', 'multi', '--sizes', '1', '--storage', 'local',
              '--repetitions', '1', '--csv', str(csv), '--workdir', str(tmp_path / 'work'),
              '--test-image', str(tiny_image), '--cache', 'none',
              '--ready-pattern', r'YOLO-GUEST-READY \S+'])
    measured = results.read_csv(csv)
    assert sorted(r.point.policy for r in measured) == sorted(plan.POLICIES)
    for result in measured:
        assert result.point.cache == 'none'
        assert result.boot_ms > 1000 and result.boot_ms_each == (result.boot_ms,)
        assert result.guest_cpu_s > 0
    cli.main(['report', str(csv), '--plots', str(tmp_path / 'plots')])
    assert (tmp_path / 'plots' / 'boot-multi-local-same-cache-none.png').exists()
