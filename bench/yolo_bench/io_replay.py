"""A boot's reads, replayed: the I/O side of a boot storm at a scale this machine's CPUs cannot
boot.

A yolofs learning window records each read a boot makes of its base file, in order, with when
it arrived and when it was answered (a trace, ``yolofs trace v2``: ``OFFSET LENGTH START_US
END_US``, microseconds from the window's first read). A replayed boot issues the same reads of a
file, one after another, each once the one before it was answered and the boot's *think time*
has passed: the time the guest spent between the previous answer and its next read (0 where
the guest had reads in flight at once), scaled by a factor (1.0: this machine's TCG boot, whose
think time is mostly emulated CPU). The kernel splits a guest's large read into FUSE reads of
at most 128 KiB, answered together: contiguous reads that were in flight at once are one read
again. Other overlapping reads are replayed one at a time: a replayed boot never has more than
one read in flight, which a guest's readahead sometimes has. A boot opens its file first, timed
with its I/O (yolofs loads a boot image that is not in memory as the file is opened).

N boots replayed at once are N threads, started together; reads release the GIL. Each boot's
I/O time is the sum of its reads' latencies; its replay time, I/O plus think time.

    python -m yolo_bench.io_replay [--factor 1.0|kvm] [--direct] [--trace T FILE [FILE ...]]
                                   [--boot TRACE FILE ...]

replays one boot of each FILE at once (of trace T; ``--boot``: of its own trace) and prints their
BootReplays, and what the process read from storage meanwhile, as JSON (yolo_bench.boot_storm
runs it inside the emulated HDD's cgroup). ``--factor kvm`` scales each trace's think time by
its own kvm_factor.
"""

import argparse
import dataclasses
import json
import math
import mmap
import os
import statistics
import sys
import threading
import time

import psutil

PAGE = mmap.PAGESIZE


@dataclasses.dataclass(frozen=True)
class Read:
    offset: int
    length: int
    think: float        # seconds the guest spent before this read, after the previous answer


def timed(text):
    """Whether a trace says when each read came (v2), which its think times come from."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith('#')]
    return bool(lines) and len(lines[0].split()) == 4


def parse_trace(text):
    """The reads of a yolofs trace (its comment lines are skipped). A trace without times (v1:
    ``OFFSET LENGTH``) replays without think time."""
    reads = []
    previous_end = None
    previous_start = None
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith('#'):
            continue
        fields = line.split()
        try:
            if len(fields) == 2:
                offset, length = map(int, fields)
                think = 0.0
            elif len(fields) == 4:
                offset, length, start, end = map(int, fields)
                think = 0.0 if previous_end is None else max(0, start - previous_end) / 1e6
                split = (reads and start < previous_end and previous_start is not None
                         and offset == reads[-1].offset + reads[-1].length)
                previous_end = end if previous_end is None else max(previous_end, end)
                previous_start = start
                if split:
                    last = reads[-1]
                    reads[-1] = Read(last.offset, last.length + length, last.think)
                    continue
            else:
                raise ValueError('expected OFFSET LENGTH [START_US END_US]')
        except ValueError as e:
            raise ValueError('trace line %d: %s: %r' % (number, e, line))
        if offset < 0 or length <= 0:
            raise ValueError('trace line %d: a read of nothing: %r' % (number, line))
        reads.append(Read(offset, length, think))
    return reads


# The seeds' idle boots under KVM took 3 to 4 s, I/O included: a KVM guest's think time is its
# own CPU work, not emulation. The 'kvm' factor scales a trace's think times to sum to this.
KVM_BOOT_THINK_SECONDS = 3.5


def kvm_factor(reads):
    """The factor that makes ``reads``' think times sum to KVM_BOOT_THINK_SECONDS (at most 1)."""
    think = sum(read.think for read in reads)
    return min(1.0, KVM_BOOT_THINK_SECONDS / think) if think else 0.0


def load_trace(path):
    with open(path) as f:
        return parse_trace(f.read())


@dataclasses.dataclass
class BootReplay:
    """One replayed boot: its reads' latencies (seconds), its bytes, from start to last answer."""
    latencies: list
    bytes: int
    seconds: float
    open_seconds: float = 0.0

    @property
    def io_seconds(self):
        return self.open_seconds + sum(self.latencies)

    @property
    def first_read(self):
        """From the open to the first read's answer: what a miss of the boot image costs."""
        return self.open_seconds + (self.latencies[0] if self.latencies else 0.0)


def _aligned(read):
    """(offset, length) covering ``read`` on page boundaries, as O_DIRECT needs."""
    start = read.offset - read.offset % PAGE
    end = -(-(read.offset + read.length) // PAGE) * PAGE
    return start, end - start


def replay_boot(path, reads, factor=1.0, direct=False, start=None):
    """Replays ``reads`` of the file at ``path`` (once ``start``, a threading.Barrier, lets it);
    with ``direct``, O_DIRECT, as QEMU opens a disk with cache=none: no page cache between the
    boot and what serves the file."""
    buffer = mmap.mmap(-1, max(_aligned(r)[1] for r in reads) if reads else PAGE)
    if start is not None:
        start.wait()
    began = time.monotonic()
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    opened = time.monotonic() - began
    try:
        latencies, nbytes = [], 0
        for read in reads:
            if read.think and factor:
                time.sleep(read.think * factor)
            offset, length = _aligned(read) if direct else (read.offset, read.length)
            issued = time.monotonic()
            got = os.preadv(fd, [memoryview(buffer)[:length]], offset)
            latencies.append(time.monotonic() - issued)
            nbytes += got
        return BootReplay(latencies, nbytes, time.monotonic() - began, opened)
    finally:
        os.close(fd)


def storage_read_bytes(pid=None):
    """Bytes process ``pid`` (None: this one) had read from storage (its I/O counters'
    ``read_bytes``; O_DIRECT reads count)."""
    return psutil.Process(pid).io_counters().read_bytes


def storm(boots, factor=1.0, direct=False):
    """Replays every (path, reads) of ``boots`` at once, each in its thread; their BootReplays,
    in order. ``factor`` 'kvm': each boot's reads scaled by their own kvm_factor. A boot whose
    replay fails raises here, after the others have ended."""
    results = [None] * len(boots)
    errors = []
    start = threading.Barrier(len(boots))

    def run(index, path, reads):
        try:
            scale = kvm_factor(reads) if factor == 'kvm' else factor
            results[index] = replay_boot(path, reads, scale, direct, start)
        except BaseException as e:          # noqa: B902 - handed to the caller
            errors.append(e)
            start.abort()

    threads = [threading.Thread(target=run, args=(i, path, reads), daemon=True)
               for i, (path, reads) in enumerate(boots)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


def percentile(values, q):
    """The q-th percentile (1-99) of ``values``, interpolated between the closest ranks."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method='inclusive')[q - 1]


def summary(results):
    """p50, p99 and max of the boots' I/O times and replay times, and the bytes they read."""
    io = [r.io_seconds for r in results]
    wall = [r.seconds for r in results]
    return {'boots': len(results), 'bytes': sum(r.bytes for r in results),
            'io_p50': percentile(io, 50), 'io_p99': percentile(io, 99), 'io_max': max(io),
            'replay_p50': percentile(wall, 50), 'replay_p99': percentile(wall, 99),
            'replay_max': max(wall)}


def factor(text):
    """A think time factor (0 or more), or 'kvm' (each trace's kvm_factor)."""
    if text == 'kvm':
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError('not a factor or \'kvm\': %r' % text)
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError('not a factor of 0 or more: %r' % text)
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m yolo_bench.io_replay',
                                     description=__doc__.splitlines()[0])
    parser.add_argument('--trace', help='the trace of every FILE')
    parser.add_argument('--boot', nargs=2, action='append', default=[],
                        metavar=('TRACE', 'FILE'), help='a boot of FILE replaying TRACE')
    parser.add_argument('--factor', type=factor, default=1.0)
    parser.add_argument('--direct', action='store_true', help='O_DIRECT, as cache=none')
    parser.add_argument('files', nargs='*')
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if bool(args.files) != bool(args.trace):
        parser.error('--trace and FILE go together')
    boots = [(args.trace, path) for path in args.files] + [tuple(boot) for boot in args.boot]
    if not boots:
        parser.error('nothing to replay')
    # Each trace parsed once, however many boots replay it.
    traces = {trace: load_trace(trace) for trace in {trace for trace, _ in boots}}
    before = storage_read_bytes()
    results = storm([(path, traces[trace]) for trace, path in boots], args.factor, args.direct)
    json.dump({'boots': [dataclasses.asdict(r) for r in results],
               'storage_read_bytes': storage_read_bytes() - before}, sys.stdout)
    return 0


if __name__ == '__main__':
    sys.exit(main())
