"""How much one image's boot spreads on this machine by itself, and whether a probe of the
machine's speed, taken before a boot, foretells it: a baseline for a boot-time model's error.

    python -m yolo_bench.spread --image debian12-yolo.qcow2 [--boots 12] [--accel tcg]

The image is booted ``--boots`` times, one after another, outside any cloud: no disk in the way
(its raw base file is read through the page cache), nothing else started. A probe thread,
meanwhile, times a fixed piece of work every ``--probe-interval`` seconds: copying 128 MiB into
memory just mapped (page faults and copies, which a booting guest's memory goes through too),
measured in its own CPU time, which a busy CPU does not inflate; it slows where the machine's
memory and CPUs do (other tenants of shared hardware, frequency, and the boot beside it).
The report gives each boot's vCPU time and what predicting each boot the median of the others
errs; then, for the probe as a host's report 60, 30 and 0 s old when the boot started would
have given it (what a scheduler could know) and for the probe during the boot (what no
prediction can know), its correlation with the boots' vCPU time, and what predicting each boot
from a line fitted through the others against the probe errs.
"""

import argparse
import dataclasses
import pathlib
import statistics
import sys
import tempfile
import threading
import time

from yolo_common import cli
from yolo_common import images
from yolo_common import qemu

PROBE_BYTES = 32 << 20
PROBE_COPIES = 4
# The probe as a host's report taken so many seconds before a boot would have given it (Nova
# reports every 60 s), averaged over the seconds before that report.
REPORT_AGES = (60, 30, 0)
REPORT_AVERAGE_SECONDS = 10


def probe_seconds(source):
    """CPU seconds of the probe's work: PROBE_COPIES copies of ``source`` into fresh memory."""
    started = time.thread_time()
    for _ in range(PROBE_COPIES):
        bytes(source)
    return time.thread_time() - started


class Probe:
    """(wall time, probe CPU seconds) every ``interval`` seconds, in a thread, until stopped."""

    def __init__(self, interval):
        self.interval = interval
        self.samples = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name='probe', daemon=True)

    def _run(self):
        source = bytearray(b'\x01' * PROBE_BYTES)
        while not self._stop.is_set():
            self.samples.append((time.time(), probe_seconds(source)))
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


@dataclasses.dataclass(frozen=True)
class Boot:
    started_at: float   # wall time
    ended_at: float     # wall time, at the ready line
    vcpu_seconds: float


def window_mean(samples, start, end):
    """The mean probe time of the ``samples`` taken in [start, end), None without any."""
    inside = [seconds for at, seconds in samples if start <= at < end]
    return statistics.mean(inside) if inside else None


def windows(boot):
    """The probe's windows for a boot: what a host's report taken so many seconds before the
    boot would have said of it (averaged over REPORT_AVERAGE_SECONDS, as yolofs averages its
    load), and the boot's own run."""
    reports = {'a report %d s old' % age: (boot.started_at - age - REPORT_AVERAGE_SECONDS,
                                           boot.started_at - age)
               for age in REPORT_AGES}
    return dict(reports, during=(boot.started_at, boot.ended_at))


def median_error(values):
    """The mean error of predicting each of ``values`` the median of the others."""
    return statistics.mean(
        abs(statistics.median(values[:i] + values[i + 1:]) / value - 1)
        for i, value in enumerate(values))


def line_error(points):
    """The mean error of predicting each point's y from the least-squares line through the
    other (x, y) points: what x foretells of y, tried on points the line was not fitted to."""
    errors = []
    for i, (x, y) in enumerate(points):
        others = points[:i] + points[i + 1:]
        line = statistics.linear_regression([p for p, _ in others], [v for _, v in others])
        errors.append(abs((line.intercept + line.slope * x) / y - 1))
    return statistics.mean(errors)


def summary(boots, samples):
    """Lines: the vCPU times' spread, each predicted the median of the others; then, per probe
    window, their correlation with the probe and each predicted from a line through the
    others against the probe."""
    vcpu = [b.vcpu_seconds for b in boots]
    lines = ['%d boots: vCPU %.1f-%.1f s (median %.1f s); each predicted the median of the '
             'others: %.1f%%' % (len(vcpu), min(vcpu), max(vcpu), statistics.median(vcpu),
                                 100 * median_error(vcpu))]
    boot_windows = [windows(b) for b in boots]
    for label in boot_windows[0]:
        points = [(window_mean(samples, *w[label]), b.vcpu_seconds)
                  for b, w in zip(boots, boot_windows)]
        points = [(probe, seconds) for probe, seconds in points if probe is not None]
        if len(points) < 4:
            lines.append('probe, %s: too few samples' % label)
        elif len({probe for probe, _ in points}) < 3 or len({s for _, s in points}) < 2:
            lines.append('probe, %s: constant' % label)
        else:
            lines.append(
                'probe, %s (%d boots): correlation with vCPU time %.2f; each predicted from a '
                'line through the others: %.1f%% (the median of the same boots\' others: '
                '%.1f%%)' % (label, len(points),
                             statistics.correlation(*zip(*points)), 100 * line_error(points),
                             100 * median_error([s for _, s in points])))
    return lines


def run(image, count, accel, ready_marker, probe_interval, pause, timeout, workdir):
    """The boots, and the probe's samples over them."""
    base = pathlib.Path(workdir) / 'base.raw'
    images.convert_to_raw(image, base)
    boots = []
    with Probe(probe_interval) as probe:
        # The probe's samples before the first boot.
        time.sleep(max(REPORT_AGES) + REPORT_AVERAGE_SECONDS)
        for i in range(count):
            overlay = pathlib.Path(workdir) / 'overlay.qcow2'
            images.create_overlay(base, overlay)
            started_at = time.time()
            with qemu.Guest(overlay, cache='writeback', accel=accel, ready_marker=ready_marker,
                            console_log=pathlib.Path(workdir) / 'console.log') as guest:
                seconds = guest.wait_ready(timeout)
                vcpu = guest.vcpu_at_ready[0]
            boots.append(Boot(started_at, time.time(), round(vcpu, 2)))
            overlay.unlink()
            print('boot %d: %.1f s, vCPU %.1f s' % (i + 1, seconds, vcpu), flush=True)
            time.sleep(pause)
    return boots, list(probe.samples)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog='python -m yolo_bench.spread',
                                     description=__doc__.splitlines()[0],
                                     formatter_class=cli.HelpFormatter)
    parser.add_argument('--image', required=True, type=cli.existing_file,
                        help='a bootable image that prints its ready line on its serial console')
    parser.add_argument('--ready-pattern', type=cli.console_pattern,
                        default=qemu.READY_MARKER, help='regular expression of the ready line')
    parser.add_argument('--boots', type=int, default=12, help='boots, one after another')
    parser.add_argument('--accel', choices=('kvm', 'tcg'), default='tcg')
    parser.add_argument('--probe-interval', type=float, default=2.0,
                        help='seconds between the probe\'s samples')
    parser.add_argument('--pause', type=float, default=5.0, help='seconds between boots')
    parser.add_argument('--boot-timeout', type=float, default=600)
    args = parser.parse_args(argv)
    if args.boots < 4:
        parser.error('--boots takes a number from 4: a line through the others needs three')
    if not args.probe_interval > 0 or not args.pause >= 0:
        parser.error('--probe-interval takes a number above 0, --pause one from 0')
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix='yolo-spread-', dir='/var/tmp') as workdir:
        boots, samples = run(args.image, args.boots, args.accel, args.ready_pattern,
                             args.probe_interval, args.pause, args.boot_timeout, workdir)
    print('\n'.join(summary(boots, samples)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
