"""Benchmark results: one CSV row per run, summaries per point, the summary table."""

import csv
import dataclasses
import statistics

from yolo_bench.plan import Point

FIELDS = ('storage', 'scenario', 'size', 'images', 'policy', 'repetition',
          'boot_ms', 'boot_ms_each', 'guest_cpu_s', 'vcpu_run_s', 'vcpu_runqueue_s',
          'swapped_in_mib', 'cache')
# Columns added later; older files without them read as zero, and as the thesis' cache mode.
OPTIONAL_FIELDS = ('vcpu_run_s', 'vcpu_runqueue_s', 'swapped_in_mib')
DEFAULT_CACHE = 'writethrough'


@dataclasses.dataclass
class Result:
    point: Point
    repetition: int
    boot_ms: int                 # the longest boot of the run, as the thesis reports
    boot_ms_each: tuple = ()     # every boot of the run
    guest_cpu_s: float = 0.0     # QEMU CPU time up to ready, the longest boot's
    vcpu_run_s: float = 0.0      # its vCPU thread: time running ...
    vcpu_runqueue_s: float = 0.0  # ... and time runnable, waiting for a CPU
    swapped_in_mib: float = 0.0  # read back from swap on the whole host while the run booted

    @property
    def blocked_s(self):
        """Boot time the vCPU was neither running nor waiting for a CPU: blocked, mostly on I/O."""
        return max(0.0, self.boot_ms / 1000 - self.vcpu_run_s - self.vcpu_runqueue_s)

    def row(self):
        p = self.point
        return {'storage': p.storage, 'scenario': p.scenario, 'size': p.size,
                'images': p.images, 'policy': p.policy, 'repetition': self.repetition,
                'boot_ms': self.boot_ms,
                'boot_ms_each': ' '.join(str(ms) for ms in self.boot_ms_each),
                'guest_cpu_s': '%.2f' % self.guest_cpu_s,
                'vcpu_run_s': '%.2f' % self.vcpu_run_s,
                'vcpu_runqueue_s': '%.2f' % self.vcpu_runqueue_s,
                'swapped_in_mib': '%.1f' % self.swapped_in_mib, 'cache': p.cache}


def write_csv(path, results):
    with open(path, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for result in results:
            writer.writerow(result.row())


def append_csv(path, result):
    """Appends one result, writing the header first if the file is new or empty."""
    append_row(path, FIELDS, result.row())


def append_row(path, fields, row):
    """Appends ``row`` (a dict) to the CSV file ``path`` of columns ``fields``, writing the
    header first if the file is new or empty (an interrupted benchmark keeps its rows)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    with open(path, 'a', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        if new:
            writer.writeheader()
        writer.writerow(row)


def read_csv(path):
    results = []
    with open(path, newline='') as f:
        for row in csv.DictReader(f):
            if not set(FIELDS) - {*OPTIONAL_FIELDS, 'cache'} <= set(row) <= set(FIELDS):
                raise ValueError('%s: expected columns %s, found %s' % (
                    path, ', '.join(FIELDS), ', '.join(row)))
            point = Point(row['storage'], row['scenario'], int(row['size']), row['images'],
                          row['policy'], row.get('cache') or DEFAULT_CACHE)
            each = tuple(int(ms) for ms in row['boot_ms_each'].split())
            results.append(Result(point, int(row['repetition']), int(row['boot_ms']), each,
                                  float(row['guest_cpu_s']),
                                  *(float(row.get(name) or 0) for name in OPTIONAL_FIELDS)))
    return results


@dataclasses.dataclass(frozen=True)
class Summary:
    point: Point
    runs: int
    median_ms: float
    min_ms: int
    max_ms: int
    # Medians of the longest boot's profile: vCPU running, waiting for a CPU, blocked.
    run_s: float = 0.0
    runqueue_s: float = 0.0
    blocked_s: float = 0.0
    swapped_in_mib: float = 0.0


def summarise(results):
    """Median, min and max of the longest boot per point, in first-seen point order."""
    by_point = {}
    for result in results:
        by_point.setdefault(result.point, []).append(result)
    summaries = []
    for point, runs in by_point.items():
        times = [r.boot_ms for r in runs]
        summaries.append(Summary(
            point, len(runs), statistics.median(times), min(times), max(times),
            statistics.median(r.vcpu_run_s for r in runs),
            statistics.median(r.vcpu_runqueue_s for r in runs),
            statistics.median(r.blocked_s for r in runs),
            statistics.median(r.swapped_in_mib for r in runs)))
    return summaries


def profile_table(summaries):
    """Where the longest boot's time went, per point (medians, seconds); under memory pressure,
    also how much was read back from swap meanwhile."""
    swap = any(s.point.scenario == 'memory' for s in summaries)
    head = ('| storage | cache | scenario | size | images | policy | boot | vCPU running | '
            'waiting for a CPU | blocked (I/O, timers) |')
    rule = '|---|---|---|---|---|---|---:|---:|---:|---:|'
    lines = [head + ' swapped in (MiB) |', rule + '---:|'] if swap else [head, rule]
    for s in summaries:
        p = s.point
        # A boot never runs for 0 s: no profile was recorded (files from before it was).
        profile = ('%.1f | %.1f | %.1f' % (s.run_s, s.runqueue_s, s.blocked_s) if s.run_s
                   else '- | - | -')
        if swap:
            profile += ' | %.1f' % s.swapped_in_mib
        lines.append('| %s | %s | %s | %s | %s | %s | %.1f | %s |' % (
            p.storage, p.cache, p.scenario, p.size, p.images, p.policy, s.median_ms / 1000,
            profile))
    return '\n'.join(lines)


def ratio(summaries, point, policy, other):
    """median(other policy) / median(policy) at the same point: how many times faster."""
    medians = {s.point: s.median_ms for s in summaries}
    a = medians.get(dataclasses.replace(point, policy=policy))
    b = medians.get(dataclasses.replace(point, policy=other))
    return b / a if a and b else None


def table(summaries):
    """A Markdown table: one row per (storage, cache mode, scenario, size, images), one column
    per policy."""
    policies = list(dict.fromkeys(s.point.policy for s in summaries))
    rows = {}
    for s in summaries:
        key = (s.point.storage, s.point.cache, s.point.scenario, s.point.size, s.point.images)
        rows.setdefault(key, {})[s.point.policy] = s
    head = ['storage', 'cache', 'scenario', 'size', 'images'] + \
        ['%s s (min-max)' % p for p in policies]
    if 'normal' in policies:
        head += ['normal / %s' % p for p in policies if p != 'normal']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * 5 + '---:|' * (len(head) - 5)]
    for key, by_policy in rows.items():
        cells = [str(k) for k in key]
        for p in policies:
            s = by_policy.get(p)
            cells.append('%.1f (%.1f-%.1f)' % (s.median_ms / 1000, s.min_ms / 1000,
                                               s.max_ms / 1000) if s else '-')
        if 'normal' in policies:
            normal = by_policy.get('normal')
            for p in policies:
                if p == 'normal':
                    continue
                s = by_policy.get(p)
                cells.append('%.2f' % (normal.median_ms / s.median_ms) if normal and s else '-')
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)
