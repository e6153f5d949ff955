"""The boot-time model against a compute host's own timed boots, each predicted from the ones
before it, as the host would have reported its parameters then, for the load it recorded.

    python -m yolo_bench.replay /var/lib/nova/yolo/observed-boots.json [--cpus 2]

Each boot that had at least ``--learn-from-boots`` boots served from a boot image before it is
predicted from the host's parameters learned from those boots only (with the uncalibrated
host's as the base, or ``--calibration``'s), and from the load recorded with it: what the host
reported when the boot was asked for. It does so twice, side by side: beta from the last boots
(as built, calibration.BETA_HALF_LIFE_BOOTS) and from all the boots kept alike. Boots under I/O
load (x at least 0.5) are reported apart: their error is the I/O term's, the others' the CPU
part's. The scheduler predicts from the host's last report, up to a minute older than the load
recorded here.
"""

import argparse
import dataclasses
import os
import statistics
import sys

from yolo_nova import boot_model
from yolo_nova import calibration

# Boots at this I/O utilisation or more are "under I/O load" in the report.
LOADED = 0.5
HALF_LIVES = {'beta from the last boots': calibration.BETA_HALF_LIFE_BOOTS,
              'all boots alike': None}


def predicted(known, boot):
    """The model's boot time for ``boot``'s load and kind from the parameters ``known``."""
    return boot_model.predict(known.params, boot.io_utilisation, boot.cpu_utilisation,
                              boot_image=boot.boot_image,
                              concurrent_boots=boot.concurrent_boots, runnable=boot.runnable,
                              idlest_cpu=boot.idlest_cpu_utilisation,
                              cpu_pressure=boot.cpu_pressure)


def replay(base, boots, min_boots, beta_half_life):
    """[(boot, prediction)] for each of ``boots`` with ``min_boots`` boots served from a boot
    image before it (by start), each predicted from those before it."""
    boots = sorted(boots, key=lambda boot: boot.started_at)
    replayed = []
    for i, boot in enumerate(boots):
        before = boots[:i]
        if sum(b.boot_image for b in before) < max(1, min_boots):
            continue
        known = calibration.with_observed_boots(base, before, min_boots, beta_half_life)
        replayed.append((boot, predicted(known, boot)))
    return replayed


def error(boot, prediction):
    return prediction / boot.seconds - 1


def report(base, boots, min_boots):
    """Lines: every replayed boot with its predictions, then the mean absolute errors."""
    runs = {label: replay(base, boots, min_boots, half_life)
            for label, half_life in HALF_LIVES.items()}
    first = next(iter(runs.values()))
    if not first:
        return ['no boot to replay: fewer than %d served from a boot image before any'
                % min_boots]
    lines = ['| boot | served from its boot image | io | cpu load | took (s) | %s |' % (
        ' | '.join('predicted, %s' % label for label in runs)),
             '|---:|---|---:|---:|---:|%s' % ('---:|' * len(runs))]
    start = first[0][0].started_at
    for i, (boot, _) in enumerate(first):
        cells = ['%+.0f s' % (boot.started_at - start), 'yes' if boot.boot_image else 'no',
                 '%.2f' % boot.io_utilisation, '%.2f' % calibration.cpu_load_of(boot),
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
            count = sum(chosen(b) for b, _ in first)
            lines.append('%d boot%s %s: mean model error %s' % (
                count, '' if count == 1 else 's', group, ', '.join(means)))
    return lines


def parse_args(argv):
    parser = argparse.ArgumentParser(prog='python -m yolo_bench.replay',
                                     description=__doc__.splitlines()[0])
    parser.add_argument('observed_boots', help="a host's [yolo] observed_boots_file")
    parser.add_argument('--cpus', type=int, default=os.cpu_count(),
                        help="the host's CPUs (default: this machine's, %(default)s)")
    parser.add_argument('--learn-from-boots', type=int, default=3,
                        help="the host's [yolo] learn_from_boots (default: %(default)s)")
    parser.add_argument('--calibration',
                        help="the host's [yolo] calibration_file (default: uncalibrated)")
    args = parser.parse_args(argv)
    if args.cpus < 1 or args.learn_from_boots < 1:
        parser.error('--cpus and --learn-from-boots take a number from 1')
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        boots = calibration.load_observed(args.observed_boots)
        base = calibration.load(args.calibration) if args.calibration \
            else calibration.UNCALIBRATED
    except ValueError as e:
        sys.exit(str(e))
    if base is None:
        sys.exit('%s: no such file' % args.calibration)
    base = dataclasses.replace(base, cpus=args.cpus)
    print('\n'.join(report(base, boots, args.learn_from_boots)))
    return 0


if __name__ == '__main__':
    sys.exit(main())
