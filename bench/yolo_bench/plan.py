"""Which boots a benchmark run makes, and in what order.

A *point* is one configuration (storage, scenario, its size, images, policy, QEMU's cache mode); a
*run* is one repetition of a point. Runs are ordered repetition by repetition, and inside a
repetition point by point with every policy in turn, so that slow drifts of a shared, noisy
machine hit all policies alike instead of biasing whichever was measured last.
"""

import dataclasses
import itertools

POLICIES = ('normal', 'yolo', 'yolo+pin', 'warm')
SCENARIOS = ('multi', 'contention', 'memory')
STORAGES = ('local', 'hdd')
IMAGE_KINDS = ('same', 'distinct')

# The memory scenario compares boot images locked in RAM with unlocked ones.
MEMORY_POLICIES = ('normal', 'yolo', 'yolo-unlocked')
# QEMU's cache modes for the guests' disks: the thesis' (reads through the host's page cache), and
# Nova's wherever the instance directory supports O_DIRECT (the page cache bypassed).
CACHE_MODES = ('writethrough', 'none')


@dataclasses.dataclass(frozen=True)
class Point:
    """One configuration to measure."""
    storage: str
    scenario: str
    size: int       # multi: simultaneous boots; contention: I/O stressors; memory: MiB left free
    images: str     # 'same' or 'distinct' (multi); 'same' otherwise
    policy: str
    cache: str = 'writethrough'     # QEMU's cache mode for the guests' disks

    @property
    def boots(self):
        return self.size if self.scenario == 'multi' else 1

    @property
    def distinct_images(self):
        return self.boots if self.images == 'distinct' else 1

    def key(self):
        return (self.storage, self.scenario, self.size, self.images, self.policy, self.cache)


@dataclasses.dataclass(frozen=True)
class Run:
    point: Point
    repetition: int


def _check(values, allowed, what):
    for value in values:
        if value not in allowed:
            raise ValueError('unknown %s %r (choose from %s)' % (what, value, ', '.join(allowed)))


def plan(storages, scenario, sizes, policies, repetitions, images=('same',),
         caches=('writethrough',)):
    """The runs of one benchmark invocation, in measuring order."""
    _check(storages, STORAGES, 'storage')
    _check(caches, CACHE_MODES, 'cache mode')
    _check([scenario], SCENARIOS, 'scenario')
    _check(policies, MEMORY_POLICIES if scenario == 'memory' else POLICIES, 'policy')
    _check(images, IMAGE_KINDS, 'image kind')
    if scenario != 'multi' and tuple(images) != ('same',):
        raise ValueError('distinct images only apply to the multi scenario')
    if repetitions < 1:
        raise ValueError('at least one repetition')
    if scenario == 'multi' and min(sizes) < 1:
        raise ValueError('the multi scenario boots at least one VM')
    if scenario == 'contention' and min(sizes) < 0:
        raise ValueError('a negative number of stressors')
    runs = []
    for storage in storages:
        for repetition in range(repetitions):
            for cache, size, kind in itertools.product(caches, sizes, images):
                if kind == 'distinct' and size == 1 and 'same' in images:
                    continue  # one VM: distinct images is the same configuration as same
                for policy in policies:
                    runs.append(Run(Point(storage, scenario, size, kind, policy, cache),
                                    repetition))
    return runs


def images_needed(runs):
    """How many distinct base files the runs need."""
    return max((run.point.distinct_images for run in runs), default=1)
