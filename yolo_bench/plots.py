"""PNG plots of benchmark summaries: boot time against scenario size, one line per policy."""

import pathlib

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
