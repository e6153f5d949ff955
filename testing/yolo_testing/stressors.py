"""I/O stressors: fio processes reading and writing their own files on a disk at random, as the
thesis' contention scenarios load a compute host's disk."""

import contextlib
import subprocess
import time

# Each stressor's file.
STRESSOR_FILE_MIB = 512


def stressor_file(disk, i):
    return disk.root / ('stress%d.dat' % i)


@contextlib.contextmanager
def io_stressors(disk, count):
    """``count`` fio processes doing random reads and writes on their own files on the disk."""
    procs = []
    try:
        for i in range(count):
            procs.append(subprocess.Popen(
                ['fio', '--name=stress%d' % i, '--filename=%s' % stressor_file(disk, i),
                 '--size=%dM' % STRESSOR_FILE_MIB,
                 '--rw=randrw', '--rwmixread=50', '--bs=64k', '--ioengine=libaio',
                 '--iodepth=4', '--direct=1', '--time_based', '--runtime=86400'],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                preexec_fn=disk.join_cgroup))
        if count:
            time.sleep(3)  # let them reach a steady state
        yield
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
