"""Servers at once through Nova, on the all-in-one's first compute host: a boot storm through
the whole stack, to show that nothing breaks.

    python -m yolo_bench.nova_storm [--servers 8] [--images same,distinct] [--stressors 8]
                                    [--json FILE]

The instances directory is on the emulated HDD under fio stressors, as in yolo_bench.cloud,
whose setting this shares (the second host disabled, each image booted once untimed first).
Then, per kind of images, ``--servers`` servers at once with YOLO on: of one image (one request,
``--min N --max N``) or of N distinct images (a request each). On two cores under TCG, eight
guests are bound by the CPU whatever serves their disks: this is not a boot-time comparison
(yolo_bench.boot_storm measures the I/O side at scale), but a check of the stack under it.
Reported per run: every guest ready and its times, errors in the cloud's logs meanwhile (lines
at ERROR or CRITICAL, and tracebacks, in every log of the all-in-one), yolofs' CPU seconds and
its peak resident memory, and the scheduler's view (YoloBootFilter's predictions for the
requests, from its log).
"""

import argparse
import contextlib
import json
import pathlib
import re
import sys
import threading

import psutil

from yolo_bench import cloud
from yolo_testing import aio

# A line at ERROR or CRITICAL in oslo.log's format, gunicorn's or yolofs', or a traceback.
ERROR_LINE = re.compile(r'^(\S+ \S+ \d+ (ERROR|CRITICAL) '
                        r'|\[[^]]*\] \[\d+\] \[(ERROR|CRITICAL)\]'
                        r'|\[\S+ (ERROR) '
                        r'|Traceback )')


def log_positions(log_dir=aio.LOG_DIR):
    """{log file: its size}: where this run's lines begin."""
    return {path: path.stat().st_size for path in pathlib.Path(log_dir).glob('*.log')}


def errors_since(positions, log_dir=aio.LOG_DIR):
    """{log file name: [its ERROR, CRITICAL and traceback lines written since ``positions``]}."""
    found = {}
    for path in sorted(pathlib.Path(log_dir).glob('*.log')):
        lines = [line for line in aio.text_since(path, positions.get(path, 0)).splitlines()
                 if ERROR_LINE.match(line)]
        if lines:
            found[path.name] = lines
    return found


class ProcessSampler:
    """A process's CPU seconds and peak resident memory while the ``with`` block runs, sampled
    every ``interval`` seconds; ``pid_of()`` names the process (a restarted one is followed)."""

    def __init__(self, pid_of, interval=1.0):
        self.pid_of = pid_of
        self.interval = interval
        self.peak_rss_bytes = 0
        self.cpu_seconds = 0.0
        self._first = {}
        self._last = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self):
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self):
        with contextlib.suppress(psutil.Error, OSError, ValueError):
            process = psutil.Process(self.pid_of())
            times = process.cpu_times()
            self._last[process.pid] = times.user + times.system
            self._first.setdefault(process.pid, self._last[process.pid])
            self.cpu_seconds = sum(used - self._first[pid] for pid, used in self._last.items())
            self.peak_rss_bytes = max(self.peak_rss_bytes, process.memory_info().rss)


def yolofs_pid():
    """The first host's yolofs (the keeper's child: the daemon itself)."""
    keeper = int(aio.YOLOFS_PID_FILE.read_text())
    children = psutil.Process(keeper).children()
    return children[0].pid if children else keeper


def run(args, bench, kind):
    """``args.servers`` servers at once of one image or of distinct ones, YOLO on, beside
    ``args.stressors`` stressors: the report of the run."""
    booted = bench.image if kind == 'same' else [bench.image] + bench.copies[:args.servers - 1]
    logs = log_positions()
    scheduler_from = aio.log_position()
    try:
        with ProcessSampler(yolofs_pid) as yolofs:
            boot = cloud.measure(args, bench.node, bench.user, bench.admin, booted, bench.flavor,
                                 'on', args.stressors, args.servers, kind, 1)
        outcome = {'ready': True, 'active_seconds': boot.active_seconds,
                   'ready_seconds': boot.ready_seconds, 'cache': boot.cache,
                   'guest_disk_seconds': boot.disk_seconds}
    except (cloud.GuestFailed, RuntimeError) as e:
        outcome = {'ready': False, 'failure': str(e)}
    return dict(outcome, kind=kind, servers=args.servers, stressors=args.stressors,
                yolofs_cpu_seconds=yolofs.cpu_seconds,
                yolofs_peak_rss_mib=yolofs.peak_rss_bytes / (1 << 20),
                errors=errors_since(logs),
                scheduler=[dict(zip(('host', 'predicted_seconds', 'io_utilisation', 'verdict'),
                                    line)) for line in aio.prediction_lines(scheduler_from)])


def report_lines(run):
    lines = ['%d servers at once (%s), %d stressors: %s' % (
        run['servers'], 'one image' if run['kind'] == 'same' else 'distinct images',
        run['stressors'],
        'every guest ready, the last %.1f s after the request (ACTIVE %.1f s)' % (
            run['ready_seconds'], run['active_seconds']) if run['ready']
        else 'FAILED: %s' % run['failure'])]
    lines.append('  yolofs: %.1f CPU s, peak resident memory %.0f MiB' % (
        run['yolofs_cpu_seconds'], run['yolofs_peak_rss_mib']))
    errors = sum(len(found) for found in run['errors'].values())
    lines.append('  errors in the cloud\'s logs: %s' % (
        'none' if not errors else ', '.join('%s: %d lines' % (name, len(found))
                                            for name, found in run['errors'].items())))
    for name, found in run['errors'].items():
        lines.extend('    %s: %s' % (name, line[:200]) for line in found[:5])
    predicted = [p['predicted_seconds'] for p in run['scheduler']]
    lines.append('  scheduler: %d predictions%s' % (
        len(predicted), ', %.1f-%.1f s, %s' % (
            min(predicted), max(predicted),
            ', '.join(sorted({'%s %s' % (p['host'], p['verdict']) for p in run['scheduler']})))
        if predicted else ''))
    return lines


def parse_args(argv):
    parser = argparse.ArgumentParser(prog='python -m yolo_bench.nova_storm',
                                     description=__doc__.splitlines()[0])
    parser.add_argument('--servers', type=int, default=8, help='(default: %(default)s)')
    parser.add_argument('--images', type=cloud.comma_separated(cloud.IMAGE_KINDS,
                                                               'kind of images'),
                        default=list(cloud.IMAGE_KINDS), help='(default: same,distinct)')
    parser.add_argument('--stressors', type=int, default=8, help='(default: %(default)s)')
    parser.add_argument('--cloud', default='aio-demo')
    parser.add_argument('--admin-cloud', default='aio-admin')
    parser.add_argument('--image', default='debian12-yolo')
    parser.add_argument('--image-file', type=pathlib.Path)
    parser.add_argument('--flavor', default='m1.yolo')
    parser.add_argument('--timeout', type=float, default=3600.0,
                        help='seconds the servers may take (default: %(default)s)')
    parser.add_argument('--json', type=pathlib.Path, help='write every run to this file')
    cloud.ready_pattern_option(parser)
    args = parser.parse_args(argv)
    args.storage = 'hdd'
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cloud.set_ready_pattern(args.ready_pattern)
    runs = []
    distinct = args.servers if 'distinct' in args.images else 1
    # The HDD's stressor files, as yolo_bench.cloud makes them for its list of counts.
    setting = argparse.Namespace(**dict(vars(args), stressors=[args.stressors]))
    with cloud.first_host_bench(setting, distinct) as bench:
        for kind in args.images:
            runs.append(run(args, bench, kind))
            print('\n'.join(report_lines(runs[-1])), flush=True)
            if args.json:
                args.json.write_text(json.dumps(runs, indent=1) + '\n')
    return 0 if all(r['ready'] and not r['errors'] for r in runs) else 1


if __name__ == '__main__':
    sys.exit(main())
