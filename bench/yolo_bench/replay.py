"""The boot-time model against a compute host's own timed boots, each predicted from the ones
it could have learned from, for the load recorded with it.

    python -m yolo_bench.replay /var/lib/nova/yolo/observed-boots.json [--cpus 2] [--accel tcg]

Each boot is predicted from the parameters its host learns (estimators.with_observed_boots,
on the uncalibrated host's or ``--calibration``'s) from the boots that were over (ready) when
it started, once at least ``--learn-from-boots`` of them were served from a boot image, and
from the load recorded with it: what the host measured when the boot was asked for. It does so
twice, side by side: beta from the last boots (as built, estimators.BETA_HALF_LIFE_BOOTS) and
from all the boots kept alike. Boots under I/O load (x at least 0.5) are reported apart: their
error is the I/O term's, the others' the CPU part's. Beside them, the error of predicting every
boot of a group the group's median time, known only afterwards: what the boots' own spread
costs a model whose inputs do not foretell it.

What the scheduler predicted differs in what it had: the host's last report (parameters and
load up to a minute older), Nova's count of the builds under way (``num_io_ops``: until ACTIVE,
where the host counts its timed boots until ready), and nova.conf's or an aggregate's
``boot_time_*`` where set (not read here). The host's file keeps its last 20 boots: the first
ones replayed were learned, in service, from older boots as well.
"""

import argparse
import dataclasses
import os
import statistics
import sys

from yolo_nova.model import calibration
from yolo_nova.model import estimators
from yolo_nova.model import host_stats
from yolo_nova.model import prediction

# Boots at this I/O utilisation or more are "under I/O load" in the report.
LOADED = 0.5
HALF_LIVES = {'beta from the last boots': estimators.BETA_HALF_LIFE_BOOTS,
              'all boots alike': None}
# The image the replayed boots are of, for the scheduler's own prediction (host_stats).
IMAGE = 'replayed'


def predicted(known, boot):
    """What the scheduler predicts for ``boot``'s image, load and boots under way from a host
    with the parameters ``known`` (host_stats.HostBootState.predict)."""
    state = host_stats.HostBootState(
        io_utilisation=boot.io_utilisation, cpu_utilisation=boot.cpu_utilisation,
        params=known.params, boot_images=frozenset([IMAGE] if boot.boot_image else []),
        updated_at=boot.started_at, runnable=boot.runnable,
        idlest_cpu_utilisation=boot.idlest_cpu_utilisation, cpu_pressure=boot.cpu_pressure)
    # The image cached on the host, as it was for every boot timed but the first boots before
    # the download, which take streamed_boot_factor times as long.
    held = state.predict(prediction.RequestedImage(IMAGE), boot.concurrent_boots).held
    return held * known.streamed_boot_factor if boot.streamed else held


def replay(base, boots, min_boots, beta_half_life):
    """[(boot, prediction)], by start, for each of ``boots`` that started after ``min_boots``
    boots served from a boot image were over, each predicted from the boots over by then."""
    replayed = []
    for boot in sorted(boots, key=lambda b: b.started_at):
        over = [b for b in boots if b.started_at + b.seconds <= boot.started_at]
        if sum(b.boot_image and not b.streamed for b in over) < max(1, min_boots):
            continue
        known = estimators.with_observed_boots(base, over, min_boots, beta_half_life)
        replayed.append((boot, predicted(known, boot)))
    return replayed


def error(boot, prediction):
    return prediction / boot.seconds - 1


def report(base, boots, min_boots):
    """Lines: every replayed boot with its predictions, then the mean absolute errors."""
    runs = {label: replay(base, boots, min_boots, half_life)
            for label, half_life in HALF_LIVES.items()}
    recent_run = runs['beta from the last boots']
    if not recent_run:
        return ['no boot to replay: fewer than %d served from a boot image before any'
                % min_boots]
    lines = ['| boot | served from its boot image | io | cpu load | took (s) | %s |' % (
        ' | '.join('predicted, %s' % label for label in runs)),
             '|---:|---|---:|---:|---:|%s' % ('---:|' * len(runs))]
    start = recent_run[0][0].started_at
    for i, (boot, _) in enumerate(recent_run):
        cells = ['%+.0f s' % (boot.started_at - start), 'yes' if boot.boot_image else 'no',
                 '%.2f' % boot.io_utilisation, '%.2f' % estimators.cpu_load_of(boot),
                 '%.1f' % boot.seconds]
        cells += ['%.1f (%+.0f%%)' % (p, 100 * error(b, p))
                  for b, p in (run[i] for run in runs.values())]
        lines.append('| %s |' % ' | '.join(cells))
    for group, chosen in (('without I/O load', lambda b: b.io_utilisation < LOADED),
                          ('under I/O load', lambda b: b.io_utilisation >= LOADED)):
        means = []
        for label, run in runs.items():
            errors = [abs(error(b, p)) for b, p in run if chosen(b)]
            if errors:
                means.append('%.0f%% (%s)' % (100 * statistics.mean(errors), label))
        if means:
            count = sum(chosen(b) for b, _ in recent_run)
            lines.append('%d boot%s %s: mean model error %s; %s' % (
                count, '' if count == 1 else 's', group, ', '.join(means),
                spread([b for b, _ in recent_run if chosen(b)])))
    return lines


def spread(boots):
    """The error of predicting each of ``boots`` their median time, known only afterwards."""
    median = statistics.median(b.seconds for b in boots)
    return 'their own median (%.1f s) as the prediction: %.0f%%' % (
        median, 100 * statistics.mean(abs(median / b.seconds - 1) for b in boots))


def parse_args(argv):
    parser = argparse.ArgumentParser(prog='python -m yolo_bench.replay',
                                     description=__doc__.splitlines()[0])
    parser.add_argument('observed_boots', help="a host's [yolo] observed_boots_file")
    parser.add_argument('--cpus', type=int, default=os.cpu_count(),
                        help="the host's CPUs (default: this machine's, %(default)s)")
    parser.add_argument('--learn-from-boots', type=int, default=3,
                        help="the host's [yolo] learn_from_boots (default: %(default)s)")
    parser.add_argument('--accel', choices=('kvm', 'tcg'),
                        help="only the boots under the host's accelerator, as the host learns "
                             "(default: every boot)")
    parser.add_argument('--calibration',
                        help="the host's [yolo] calibration_file (default: uncalibrated)")
    args = parser.parse_args(argv)
    if args.cpus < 1 or args.learn_from_boots < 1:
        parser.error('--cpus and --learn-from-boots take a number from 1')
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        boots = estimators.load_observed(args.observed_boots)
        base = calibration.load(args.calibration) if args.calibration \
            else calibration.UNCALIBRATED
    except ValueError as e:
        sys.exit(str(e))
    if base is None:
        sys.exit('%s: no such file' % args.calibration)
    if args.accel:
        if base.accel and base.accel != args.accel:
            sys.exit('%s: its boots ran under %s, not %s: the host ignores it' % (
                args.calibration, base.accel, args.accel))
        boots = [boot for boot in boots if boot.accel == args.accel]
    base = dataclasses.replace(base, cpus=args.cpus)
    print('\n'.join(report(base, boots, args.learn_from_boots)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
