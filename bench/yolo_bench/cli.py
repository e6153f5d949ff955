"""yolo-boot-bench: boot real VMs under the thesis' scenarios and report boot times per policy.

    yolo-boot-bench run --scenario multi --sizes 1,2,4 --images same,distinct --storage hdd
    yolo-boot-bench run --scenario contention --sizes 0,1,2,4 --storage hdd
    yolo-boot-bench run --scenario contention --sizes 8 --cache none,writethrough
    yolo-boot-bench run --test-image other.qcow2 --ready-pattern 'login: ?$'
    yolo-boot-bench report results/boot.csv

``run`` appends one CSV row per run to --csv (so an interrupted benchmark keeps what it measured)
and prints the summary; ``report`` turns CSV files into the Markdown summary table and PNG plots.
"""

import argparse
import pathlib
import shutil
import subprocess
import sys

from yolo_bench import plan as plan_mod
from yolo_bench import results as results_mod
from yolo_common import cli
from yolo_common import qemu
from yolo_testing import REPO


def _list(kind=str):
    return lambda text: [kind(item) for item in text.split(',') if item]


def parse_args(argv):
    parser = argparse.ArgumentParser(prog='yolo-boot-bench', description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest='command', required=True)
    run = sub.add_parser('run', help='boot VMs and record boot times',
                         formatter_class=cli.HelpFormatter)
    run.add_argument('--scenario', choices=plan_mod.SCENARIOS, default='multi',
                     help='what varies: simultaneous boots, I/O stressors or free memory')
    run.add_argument('--sizes', type=_list(int), default=[1],
                     help='multi: simultaneous boots; contention: I/O stressors; '
                          'memory: MiB left free (comma-separated)')
    run.add_argument('--images', type=_list(), default=['same'],
                     help='multi: same and/or distinct images')
    run.add_argument('--policies', type=_list(), default=None,
                     help='default: %s (memory: %s)' % (','.join(plan_mod.POLICIES),
                                                        ','.join(plan_mod.MEMORY_POLICIES)))
    run.add_argument('--storage', type=_list(), default=['hdd'],
                     help='hdd (the emulated HDD) and/or local (this machine\'s disk)')
    run.add_argument('--cache', type=_list(), default=['writethrough'],
                     help='QEMU cache modes of the guests\' disks: writethrough (the thesis\') '
                          'and/or none (Nova\'s where O_DIRECT works: no page cache)')
    run.add_argument('--repetitions', type=int, default=3, help='runs of each configuration')
    run.add_argument('--csv', type=pathlib.Path, default=REPO / 'results' / 'boot.csv',
                     help='one row per run is appended to it')
    run.add_argument('--workdir', type=pathlib.Path,
                     default=pathlib.Path('/var/tmp/yolo-boot-bench'),
                     help='scratch space for base files, overlays and mounts')
    run.add_argument('--test-image', type=cli.existing_file,
                     help='qcow2 to boot (default: the one tools/build-test-image.sh builds)')
    run.add_argument('--ready-pattern', type=cli.console_pattern, default=qemu.READY_MARKER,
                     help='regular expression the guest prints on its serial console when it '
                          'is ready (default: the test image\'s %r)' % qemu.READY_MARKER.decode())
    report = sub.add_parser('report', help='summary table and plots from CSV files',
                            formatter_class=cli.HelpFormatter)
    report.add_argument('csv', type=cli.existing_file, nargs='+',
                        help='CSV files written by yolo-boot-bench run')
    report.add_argument('--plots', type=pathlib.Path, default=None,
                        help='directory for PNG plots (default: none)')
    args = parser.parse_args(argv)
    if args.command == 'run' and args.policies is None:
        args.policies = list(plan_mod.MEMORY_POLICIES if args.scenario == 'memory'
                             else plan_mod.POLICIES)
    return args


def command_run(args):
    from yolo_bench import runner

    runs = plan_mod.plan(args.storage, args.scenario, args.sizes, args.policies,
                         args.repetitions, args.images, args.cache)
    test_image = args.test_image or subprocess.run(
        [str(REPO / 'tools' / 'build-test-image.sh')], check=True, capture_output=True,
        text=True).stdout.split()[-1]
    work = args.workdir
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    runner.log('%d runs planned; learning the boot image' % len(runs))
    trace = runner.learn_boot_image(test_image, work, args.ready_pattern)
    measured = []
    for storage in args.storage:
        storage_runs = [r for r in runs if r.point.storage == storage]
        disk = runner.make_disk(storage, work)
        runner.log('storage %s: %s' % (storage, disk.describe()))
        stressors = max((r.point.size for r in storage_runs
                         if r.point.scenario == 'contention'), default=0)
        with runner.StorageSession(disk, work, test_image, plan_mod.images_needed(storage_runs),
                                   trace, stressors,
                                   memory_pressure=args.scenario == 'memory',
                                   ready_marker=args.ready_pattern) as session:
            for i, run in enumerate(storage_runs):
                console_dir = work / 'consoles' / ('%s-%d' % (storage, i))
                console_dir.mkdir(parents=True)
                result = runner.measure(session, run, console_dir)
                results_mod.append_csv(args.csv, result)
                measured.append(result)
                runner.log('%d/%d %s cache=%s %s size=%d %s %s: %.1f s (each: %s)' % (
                    i + 1, len(storage_runs), storage, run.point.cache, run.point.scenario,
                    run.point.size, run.point.images, run.point.policy, result.boot_ms / 1000,
                    ' '.join('%.1f' % (ms / 1000) for ms in result.boot_ms_each)))
    print(results_mod.table(results_mod.summarise(measured)))


def command_report(args):
    measured = [r for path in args.csv for r in results_mod.read_csv(path)]
    summaries = results_mod.summarise(measured)
    print(results_mod.table(summaries))
    print()
    print(results_mod.profile_table(summaries))
    if args.plots:
        from yolo_bench import plots
        for path in plots.plot(summaries, args.plots):
            print('plot: %s' % path)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == 'run':
        command_run(args)
    else:
        command_report(args)


if __name__ == '__main__':
    main()
