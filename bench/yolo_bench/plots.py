"""PNG plots of benchmark summaries: boot time against scenario size, one line per policy (the
QEMU-level benchmark); boot time per condition, one bar per policy (boots through Nova)."""

import pathlib
import statistics

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from yolo_bench import results  # noqa: E402

X_LABELS = {'multi': 'VMs booted at once', 'contention': 'co-located I/O stressors',
            'memory': 'MiB of memory left free'}
Y_LABELS = {'multi': 'longest boot time (s)', 'contention': 'boot time (s)',
            'memory': 'boot time (s)'}


def plot(summaries, directory):
    """One figure per (storage, cache mode, scenario, images); returns the files written."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    groups = {}
    for s in summaries:
        key = (s.point.storage, s.point.cache, s.point.scenario, s.point.images)
        groups.setdefault(key, {}).setdefault(s.point.policy, []).append(s)
    written = []
    for (storage, cache, scenario, image_kind), by_policy in groups.items():
        fig, ax = plt.subplots(figsize=(6, 4))
        for policy, points in by_policy.items():
            points.sort(key=lambda s: s.point.size)
            xs = [s.point.size for s in points]
            ys = [s.median_ms / 1000 for s in points]
            low = [(s.median_ms - s.min_ms) / 1000 for s in points]
            high = [(s.max_ms - s.median_ms) / 1000 for s in points]
            ax.errorbar(xs, ys, yerr=[low, high], marker='o', capsize=3, label=policy)
        ax.set_xlabel(X_LABELS[scenario])
        ax.set_ylabel(Y_LABELS[scenario])
        title = '%s, %s storage, cache=%s' % (scenario, storage, cache)
        if scenario == 'multi':
            title += ', %s images' % image_kind
        ax.set_title(title + ' (median, min-max)')
        ax.set_ylim(bottom=0)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend()
        suffix = '' if cache == results.DEFAULT_CACHE else '-cache-' + cache
        path = directory / ('boot-%s-%s-%s%s.png' % (scenario, storage, image_kind, suffix))
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def policy_bars(groups, path, title, ylabel):
    """Grouped bars: ``groups`` maps a condition's label to {policy: [seconds, ...]}; each bar
    the median, its error bar min-max. Returns the file written."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    policies = list(dict.fromkeys(p for by_policy in groups.values() for p in by_policy))
    width = 0.8 / len(policies)
    fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(groups)), 4))
    for number, policy in enumerate(policies):
        xs, medians, low, high = [], [], [], []
        for x, by_policy in enumerate(groups.values()):
            values = by_policy.get(policy)
            if values:
                median = statistics.median(values)
                xs.append(x + (number - (len(policies) - 1) / 2) * width)
                medians.append(median)
                low.append(median - min(values))
                high.append(max(values) - median)
        bars = ax.bar(xs, medians, width, yerr=[low, high], capsize=3, label=policy)
        ax.bar_label(bars, fmt='%.1f', label_type='center', color='white', fontsize=8)
    ax.set_xticks(range(len(groups)), list(groups), fontsize=9)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(axis='y', alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# (Matplotlib leaves a label starting with '_' out of the legend.)
STORM_POLICIES = {'base': 'base file in _base', 'yolofs': 'yolofs mount'}


def storm_lines(points, path):
    """Boot storms (yolo_bench.boot_storm's points): a boot's I/O time (p50, p99 as the error
    bar's top) against the boots at once, one panel per kind (same image, distinct images), a
    line per policy and stressor count; both axes logarithmic. Returns the file written."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    kinds = list(dict.fromkeys(point['kind'] for point in points))
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.5 * len(kinds), 4), squeeze=False,
                             sharey=True)
    for ax, kind in zip(axes[0], kinds):
        lines = {}
        for point in points:
            if point['kind'] == kind:
                for policy in STORM_POLICIES:
                    key = (policy, point['stressors'])
                    lines.setdefault(key, []).append((point['boots'], point[policy]))
        for (policy, stressors), values in sorted(lines.items()):
            values.sort(key=lambda value: value[0])
            p50 = [row['io_p50'] for _, row in values]
            ax.errorbar([boots for boots, _ in values], p50,
                        yerr=[[0] * len(p50), [row['io_p99'] - row['io_p50'] for _, row in values]],
                        marker='o' if policy == 'base' else 's', capsize=3,
                        linestyle='-' if stressors else '--',
                        label='%s, %d stressors' % (STORM_POLICIES[policy], stressors))
        ax.set_xscale('log', base=2)
        counts = sorted({point['boots'] for point in points if point['kind'] == kind})
        ax.set_xticks(counts, [str(count) for count in counts])
        ax.set_yscale('log')
        ax.set_xlabel('boots at once (%s image%s)' % (kind, 's' if kind == 'distinct' else ''))
        ax.grid(alpha=0.3, which='both')
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("a boot's I/O time (s), p50 to p99")
    fig.suptitle('Boot storms replayed on the emulated HDD', fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
