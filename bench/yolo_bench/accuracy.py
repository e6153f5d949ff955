"""How well the boot-time model predicts real boots: ``bench/scripts/model_accuracy.py``.

On the emulated HDD of the boot benchmark (yolo_testing.storage.ThrottledDisk), boots are made
idle (the calibration), under graded I/O load (fio at a fixed rate: a known share of the disk's
IOPS) and under graded CPU load (one process per CPU busy a fixed share of each 10 ms), each as a
normal boot and a YOLO boot. Before each boot the load runs for a settling time, then the host's
x and y are measured over a window exactly as the driver reports them (x: throughput utilisation,
operations per second of the disk against its capacity; y: busy share of all CPU time), and the
model predicts the boot from them. The idle boots calibrate alpha, beta (vCPU running time) and
alpha_yolo; the loaded boots are the evaluation.
"""

import argparse
import csv
import dataclasses
import os
import pathlib
import statistics
import subprocess
import sys
import time

from yolo_bench import plan as plan_mod
from yolo_bench import runner
from yolo_common import yolofs
from yolo_nova.model import calibration
from yolo_nova.model import estimators
from yolo_nova.model import prediction
from yolo_testing import REPO
from yolo_testing import storage as storage_mod
from yolo_testing import stressors

FIELDS = ('kind', 'level', 'policy', 'repetition', 'x', 'y', 'boot_s', 'vcpu_run_s', 'runnable')
# Normal boots under this I/O load measure k, the I/O part's exponent (not evaluated).
IO_CALIBRATION_LEVEL = 0.5
SETTLE_S = 6.0
WINDOW_S = 5.0

# One per CPU: busy ``share`` of every 10 ms, asleep the rest.
CPU_HOG = """
import os, sys, time
cpu, share = int(sys.argv[1]), float(sys.argv[2])
os.sched_setaffinity(0, {cpu})
while True:
    start = time.perf_counter()
    while time.perf_counter() - start < 0.01 * share:
        pass
    time.sleep(0.01 * (1 - share))
"""


@dataclasses.dataclass
class Row:
    kind: str        # idle, io, cpu
    level: float     # the load's target share
    policy: str      # normal, yolo
    repetition: int
    x: float
    y: float
    boot_s: float
    vcpu_run_s: float
    runnable: float = None   # other runnable tasks per CPU (None: not recorded)


def disk_counters(device):
    name = os.path.basename(device)
    with open('/proc/diskstats') as f:
        for line in f:
            fields = line.split()
            if fields[2] == name:
                return int(fields[3]) + int(fields[7]), (int(fields[5]) + int(fields[9])) * 512
    raise RuntimeError('%s is not in /proc/diskstats' % name)


def cpu_jiffies():
    with open('/proc/stat') as f:
        values = [int(v) for v in f.readline().split()[1:9]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def runnable_per_cpu():
    """Runnable tasks per CPU besides this reader (procs_running of /proc/stat)."""
    with open('/proc/stat') as f:
        for line in f:
            if line.startswith('procs_running '):
                return max(0, int(line.split()[1]) - 1) / (os.cpu_count() or 1)
    return 0.0


def measure_load(disk, seconds=WINDOW_S):
    """(x, y, runnable) over ``seconds``: the disk's throughput utilisation, the CPUs' busy
    share and the mean number of other runnable tasks per CPU (sampled every 50 ms)."""
    limits = disk.limits
    ops0, bytes0 = disk_counters(disk.loop)
    busy0, total0 = cpu_jiffies()
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        samples.append(runnable_per_cpu())
        time.sleep(0.05)
    ops1, bytes1 = disk_counters(disk.loop)
    busy1, total1 = cpu_jiffies()
    load = yolofs.HostLoad(io_utilisation=0.0, iops=(ops1 - ops0) / seconds,
                           bytes_per_second=(bytes1 - bytes0) / seconds)
    x = calibration.io_utilisation(load, limits.read_iops + limits.write_iops,
                                   limits.read_bps + limits.write_bps)
    return (round(x, 4), round((busy1 - busy0) / max(1, total1 - total0), 4),
            round(sum(samples) / len(samples), 3))


def start_load(disk, kind, level):
    """The load processes for one run (none when idle)."""
    if kind in ('io', 'iocal') and level > 0:
        rate = max(1, round(level * disk.limits.read_iops))
        return [subprocess.Popen(
            ['fio', '--name=load', '--filename=%s' % stressors.stressor_file(disk, 0),
             '--size=%dM' % stressors.STRESSOR_FILE_MIB, '--rw=randrw', '--rwmixread=50',
             '--bs=64k', '--ioengine=libaio', '--iodepth=8', '--direct=1',
             '--rate_iops=%d,%d' % (rate, rate), '--time_based', '--runtime=86400'],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=disk.join_cgroup)]
    if kind == 'cpu' and level > 0:
        return [subprocess.Popen([sys.executable, '-c', CPU_HOG, str(cpu), str(level)])
                for cpu in range(os.cpu_count())]
    return []


def stop_load(procs):
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(30)


def run(args):
    disk = storage_mod.ThrottledDisk(args.workdir / 'hdd')
    work = args.workdir / 'work'
    work.mkdir(parents=True, exist_ok=True)
    consoles = work / 'consoles'
    consoles.mkdir(exist_ok=True)
    test_image = args.test_image or subprocess.run(
        [str(REPO / 'tools' / 'build-test-image.sh')], check=True, capture_output=True,
        text=True).stdout.strip().splitlines()[-1]
    runner.log('learning the boot trace on the local disk')
    trace = runner.learn_boot_image(test_image, work)
    points = ([('idle', 0.0)] * args.idle_repetitions + [('iocal', IO_CALIBRATION_LEVEL)]
              + [('io', level) for level in args.io_levels]
              + [('cpu', level) for level in args.cpu_levels])
    with open(args.csv, 'w', newline='') as out, \
            runner.StorageSession(disk, work, test_image, 1, trace, stressors=1) as session:
        writer = csv.DictWriter(out, FIELDS)
        writer.writeheader()
        for repetition in range(args.repetitions):
            for kind, level in points:
                for policy in ('normal',) if kind == 'iocal' else ('normal', 'yolo'):
                    point = plan_mod.Point('hdd', 'contention', 0, 'same', policy)
                    session.prepare(point)
                    procs = start_load(disk, kind, level)
                    try:
                        time.sleep(SETTLE_S if procs else 0.5)
                        x, y, runnable = measure_load(disk)
                        times, cpu = runner.run_boots(session, point, consoles)
                    finally:
                        stop_load(procs)
                    row = Row(kind, level, policy, repetition, x, y, times[0] / 1000,
                              round(cpu[0][1], 2), runnable)
                    writer.writerow(dataclasses.asdict(row))
                    out.flush()
                    runner.log('%s %.2f %s: x %.2f y %.2f runnable %.2f, boot %.1f s (vCPU '
                               '%.1f s)' % (kind, level, policy, x, y, runnable, row.boot_s,
                                            row.vcpu_run_s))
    print(report(read(args.csv)))


def read(path):
    with open(path) as f:
        return [Row(r['kind'], float(r['level']), r['policy'], int(r['repetition']),
                    float(r['x']), float(r['y']), float(r['boot_s']), float(r['vcpu_run_s']),
                    float(r['runnable']) if r.get('runnable') else None)
                for r in csv.DictReader(f)]


def calibrate(rows, cpus=None):
    idle = [r for r in rows if r.kind == 'idle']
    return estimators.from_boots(
        [(r.boot_s, r.vcpu_run_s) for r in idle if r.policy == 'normal'],
        [(r.boot_s, r.vcpu_run_s) for r in idle if r.policy == 'yolo'],
        cpus=cpus or os.cpu_count() or 1)


def concurrency_report(multi_csv, cpus=2):
    """The concurrency term against the boot benchmark's multi scenario: calibrated from its
    single boots, each point predicted with n - 1 boots in progress on an otherwise idle host."""
    with open(multi_csv) as f:
        rows = [r for r in csv.DictReader(f) if r['policy'] in ('normal', 'yolo')]
    single = [Row('idle', 0, r['policy'], int(r['repetition']), 0, 0, int(r['boot_ms']) / 1000,
                  float(r['vcpu_run_s'])) for r in rows if r['size'] == '1']
    params = calibrate(single, cpus).params
    groups = {}
    for r in rows:
        groups.setdefault((int(r['size']), r['images'], r['policy']), []).append(
            int(r['boot_ms']) / 1000)
    lines = ['| boots | images | policy | measured, longest (s) | predicted (s) | error |',
             '|---|---|---|---|---|---|']
    relative = []
    for (n, kind, policy), times in sorted(groups.items()):
        if n == 1:
            continue
        measured = statistics.median(times)
        predicted = prediction.predict(params, 0, 0, boot_image=policy == 'yolo',
                                       concurrent_boots=n - 1)
        relative.append(abs(predicted - measured) / measured)
        lines.append('| %d | %s | %s | %.1f | %.1f | %+.0f %% |' % (
            n, kind, policy, measured, predicted, 100 * (predicted - measured) / measured))
    lines.append('')
    lines.append('Mean relative error %.0f %%, max %.0f %%.' % (
        100 * sum(relative) / len(relative), 100 * max(relative)))
    return '\n'.join(lines)


def io_exponent(rows, cal):
    """k from the I/O-calibration boots (median), or the thesis' 1 without any."""
    ks = [estimators.io_exponent_from(cal.params, r.boot_s, r.x, r.y, r.runnable)
          for r in rows if r.kind == 'iocal']
    return statistics.median(ks) if ks else 1.0


MODELS = ('thesis', 'measured')


def predictions(rows, model='thesis'):
    """(row, prediction) of every evaluated boot. 'thesis': appendix A as is; 'measured': with
    the I/O exponent from the I/O-calibration boots and the fair CPU share from the runnable
    tasks recorded before each boot."""
    cal = calibrate(rows)
    params = cal.params
    if model == 'measured':
        params = dataclasses.replace(params, io_exponent=io_exponent(rows, cal))
    return [(r, prediction.predict(params, r.x, r.y, boot_image=r.policy == 'yolo',
                                   runnable=r.runnable if model == 'measured' else None))
            for r in rows if r.kind in ('io', 'cpu')]


def errors(pairs):
    """(mean absolute error s, mean relative error, max absolute error s)."""
    if not pairs:
        return float('nan'), float('nan'), float('nan')
    absolute = [abs(p - r.boot_s) for r, p in pairs]
    return (sum(absolute) / len(absolute),
            sum(a / r.boot_s for a, (r, _) in zip(absolute, pairs)) / len(pairs),
            max(absolute))


def rank_agreement(pairs):
    """The share of pairs of boots (measured more than 2 s apart) the model orders as measured:
    what the weigher needs, whatever the absolute error."""
    agree = total = 0
    for i, (r1, p1) in enumerate(pairs):
        for r2, p2 in pairs[i + 1:]:
            if abs(r1.boot_s - r2.boot_s) > 2.0:
                total += 1
                agree += (r1.boot_s < r2.boot_s) == (p1 < p2)
    return agree / total if total else float('nan')


def summary_line(label, pairs):
    mean_abs, mean_rel, max_abs = errors(pairs)
    return '| %s | %d | %.1f | %.0f %% | %.1f |' % (
        label, len(pairs), mean_abs, 100 * mean_rel, max_abs)


def report(rows):
    cal = calibrate(rows)
    models = MODELS if any(r.kind == 'iocal' for r in rows) else MODELS[:1]
    both = {model: predictions(rows, model) for model in models}
    lines = ['Calibration (idle boots): alpha %.2f s, beta %.2f s, alpha_yolo %.2f s; '
             'I/O exponent k %.2f (thesis: 1)' % (cal.alpha, cal.beta, cal.alpha_yolo,
                                                  io_exponent(rows, cal)), '',
             '| load | level | policy | x | y | runnable | measured (s) | %s |' % ' | '.join(
                 'predicted, %s (s)' % m for m in models),
             '|---|---|---|---|---|---|---|%s' % ('---|' * len(models))]
    order = sorted(range(len(both['thesis'])), key=lambda i: (
        both['thesis'][i][0].kind, both['thesis'][i][0].level, both['thesis'][i][0].policy,
        both['thesis'][i][0].repetition))
    for i in order:
        r = both['thesis'][i][0]
        lines.append('| %s | %.2f | %s | %.2f | %.2f | %s | %.1f | %s |' % (
            r.kind, r.level, r.policy, r.x, r.y,
            '-' if r.runnable is None else '%.2f' % r.runnable, r.boot_s,
            ' | '.join('%.1f' % both[m][i][1] for m in models)))
    for model in models:
        pairs = both[model]
        lines += ['', 'Model: %s' % model, '',
                  '| boots | n | mean abs error (s) | mean relative error | max abs error (s) |',
                  '|---|---|---|---|---|']
        for kind in ('io', 'cpu'):
            for policy in ('normal', 'yolo'):
                subset = [(r, p) for r, p in pairs if r.kind == kind and r.policy == policy]
                lines.append(summary_line('%s, %s' % (kind, policy), subset))
        lines.append(summary_line('all', pairs))
        lines += ['', 'Pairs of boots (> 2 s apart) ordered as measured: %.0f %%.' % (
            100 * rank_agreement(pairs))]
    return '\n'.join(lines)


def plot(rows, path, model='thesis'):
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib import pyplot
    pairs = predictions(rows, model)
    figure, axes = pyplot.subplots(figsize=(6, 5))
    for kind, marker in (('io', 'o'), ('cpu', 's')):
        for policy, color in (('normal', 'tab:red'), ('yolo', 'tab:blue')):
            subset = [(r, p) for r, p in pairs if r.kind == kind and r.policy == policy]
            axes.scatter([r.boot_s for r, _ in subset], [p for _, p in subset], marker=marker,
                         color=color, label='%s load, %s boot' % (kind.upper(), policy))
    top = max([r.boot_s for r, _ in pairs] + [p for _, p in pairs]) * 1.05
    axes.plot([0, top], [0, top], color='grey', linewidth=1, label='exact')
    axes.set_xlabel('measured boot time (s)')
    axes.set_ylabel('predicted boot time (s)')
    axes.set_title('Boot-time model (%s) on the emulated HDD (TCG)' % model)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest='command', required=True)
    run_parser = sub.add_parser('run')
    run_parser.add_argument('--io-levels', type=lambda t: [float(v) for v in t.split(',')],
                            default=[0.2, 0.4, 0.6, 0.8])
    run_parser.add_argument('--cpu-levels', type=lambda t: [float(v) for v in t.split(',')],
                            default=[0.25, 0.5, 0.75])
    run_parser.add_argument('--repetitions', type=int, default=2)
    run_parser.add_argument('--idle-repetitions', type=int, default=2,
                            help='idle (calibration) boots per policy and repetition')
    run_parser.add_argument('--csv', type=pathlib.Path,
                            default=REPO / 'results' / 'model-accuracy.csv')
    run_parser.add_argument('--workdir', type=pathlib.Path,
                            default=pathlib.Path('/var/tmp/yolo-model-accuracy'))
    run_parser.add_argument('--test-image')
    report_parser = sub.add_parser('report')
    report_parser.add_argument('csv', type=pathlib.Path)
    report_parser.add_argument('--plot', type=pathlib.Path)
    report_parser.add_argument('--model', choices=MODELS, default='thesis',
                               help='the model plotted')
    concurrency_parser = sub.add_parser(
        'concurrency', help='the concurrency term against a boot benchmark multi CSV')
    concurrency_parser.add_argument('csv', type=pathlib.Path)
    concurrency_parser.add_argument('--cpus', type=int, default=2)
    args = parser.parse_args(argv)
    if args.command == 'concurrency':
        print(concurrency_report(args.csv, args.cpus))
        return 0
    if args.command == 'run':
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        run(args)
    else:
        rows = read(args.csv)
        print(report(rows))
        if args.plot:
            plot(rows, args.plot, args.model)
    return 0
