"""YOLO's point on one machine, in a few minutes: boots under I/O contention.

Builds (or reuses) the bootable test image, learns its boot image from one real QEMU boot, then
boots it three ways on an emulated HDD (the boot benchmark's: a throttled loop device) while fio
stressors keep that disk busy, each from a cold page cache: normally (backing file on the disk),
through yolofs (boot reads from the boot image in memory), and with the whole image already in
page cache (the best a cache can do, at the cost of the whole image in RAM). Prints the three
boot times side by side. The boot benchmark (docs/evaluation/boot-benchmark.md) measures the
same with repetitions and more conditions.

Usage: python3 bench/scripts/demo.py [--workdir DIR] [--stressors N] [--runs N]
"""

import argparse
import contextlib
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import threading
import time

from checkout import REPO  # noqa: E402 (makes the checkout importable)

from yolo_bench import plan  # noqa: E402
from yolo_bench import runner  # noqa: E402
from yolo_common import yolofs  # noqa: E402

POLICY_NAMES = {'normal': 'normal (backing file on the busy disk)',
                'yolo': 'YOLO (boot reads from the boot image)',
                'warm': 'warm (whole image in page cache)'}


@contextlib.contextmanager
def progress(label, every=15):
    """A line every ``every`` seconds while a long step runs, so a silent minute is explained."""
    started = time.monotonic()
    done = threading.Event()

    def tick():
        while not done.wait(every):
            runner.log('   ... %s: %d s so far' % (label, time.monotonic() - started))

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--workdir', default='/var/tmp/yolo-demo', type=pathlib.Path,
                        help='scratch space, removed at the end (default: %(default)s)')
    parser.add_argument('--stressors', type=int, default=8,
                        help='fio processes keeping the disk busy (default: %(default)s)')
    parser.add_argument('--runs', type=int, default=1,
                        help='cold boots per policy (default: %(default)s)')
    args = parser.parse_args()

    work = args.workdir
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    try:
        run_demo(work, args.stressors, args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_demo(work, stressors, repetitions):
    runner.log('the test image (tools/build-test-image.sh builds it once, about 5 minutes, '
               'then reuses it)')
    # Its progress lines and, if it fails, its cause go to the terminal.
    build = subprocess.run([str(REPO / 'tools' / 'build-test-image.sh')], stdout=subprocess.PIPE,
                           text=True)
    if build.returncode != 0:
        sys.exit('demo: building the test image failed (exit %d): see its messages above'
                 % build.returncode)
    test_image = build.stdout.split()[-1]

    runner.log('learning the boot image from one boot through a learning yolofs mount')
    with progress('learning boot'):
        trace = runner.learn_boot_image(test_image, work)
    reads = sum(1 for line in trace.read_text().splitlines() if not line.startswith('#'))

    runs = plan.plan(['hdd'], 'contention', [stressors], list(POLICY_NAMES), repetitions)
    disk = runner.make_disk('hdd', work)
    runner.log('storage: %s; %d fio stressors will keep it busy' % (disk.describe(), stressors))
    times = {policy: [] for policy in POLICY_NAMES}
    with runner.StorageSession(disk, work, test_image, 1, trace, stressors) as session:
        info = yolofs.run('inspect', '--json',
                          session.store / (session.bases[0].name + '.yolo')).stdout
        runner.log('boot image: %d boot reads, %s' % (reads, coverage(info)))
        for i, run in enumerate(runs):
            policy = run.point.policy
            console_dir = work / 'consoles' / str(i)
            console_dir.mkdir(parents=True)
            runner.log('%d/%d: %s boot, cold page cache' % (i + 1, len(runs), policy))
            with progress('%s boot' % policy):
                result = runner.measure(session, run, console_dir)
            times[policy].append(result.boot_ms / 1000)
            runner.log('%d/%d: %s boot took %.1f s' % (i + 1, len(runs), policy,
                                                       times[policy][-1]))
        stats = session.mount.client.stats(session.bases[0].name)[session.bases[0].name]

    normal = statistics.median(times['normal'])
    print()
    print('boot time under I/O contention (%d fio stressors on the emulated HDD), cold page '
          'cache%s:' % (stressors, ', median of %d' % repetitions if repetitions > 1 else ''))
    for policy, label in POLICY_NAMES.items():
        median = statistics.median(times[policy])
        print('  %-42s %6.1f s   normal / this = %.2f' % (label, median, normal / median))
    served = stats['bytes_memory'] + stats['bytes_passthrough']
    print('YOLO boots read %.1f MiB through yolofs, %.1f%% of it from the boot image.' % (
        served / 2**20, 100 * stats['bytes_memory'] / max(served, 1)))
    print('warm holds the whole image in page cache; YOLO holds only its boot image.')


def coverage(inspect_json):
    info = json.loads(inspect_json)
    return '%d extents, %.1f MiB (%.2f%% of the image)' % (
        info['extent_count'], info['covered_bytes'] / 2**20, 100 * info['coverage'])


if __name__ == '__main__':
    main()
