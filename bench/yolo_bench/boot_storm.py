"""Boot storms, their I/O side: N boots' reads replayed at once (yolo_bench.io_replay) on the
emulated HDD, from the base files and through a yolofs mount that serves their boot images.

    python -m yolo_bench.boot_storm (--trace T | --image QCOW2)... [--boots 1,2,4,8,16,32,64]
                                    [--stressors 0,8] [--kinds same,distinct] [--factor 1.0]
                                    [--json FILE]
    python -m yolo_bench.boot_storm --catalogue 200 [--arrivals 400] [--at-once 4] [--zipf 1.0]
                                    [--stressors 0,8] [--no-mlock] (--trace T | --image QCOW2)...
                                    [--json FILE]
    python -m yolo_bench.boot_storm --reboot 20 (--trace T | --image QCOW2) [--json FILE]

A trace is a real boot's (learned from ``--image`` on the machine's own disk, as the boot
benchmark learns it: ``yolofs trace v2``, with each read's arrival and answer). With several
(``--trace`` or ``--image`` given more than once: images whose boots read other files), the
distinct images take them in turn, and a storm of the same image is of the first. The base files
are synthetic: files of the image's size holding random bytes where its boot reads (sparse
elsewhere, which no replayed boot reads), one per distinct image, each with its boot image built
from its trace (``yolofs build --mark``) in a store on the same disk. Every process that touches
the disk (the replays, yolofs, the fio stressors) shares the HDD's one throttle.

Per point (stressors, same image or distinct images, N): yolofs holds the boot images the point
uses in memory (they are kept in memory on every compute host, which is YOLO's premise); the
page cache is dropped; the N boots are replayed at once from ``_base``, then through
the mount, both with O_DIRECT (QEMU's ``cache=none``, Nova's default for a disk that supports
it). Reported: each boot's I/O time (p50, p99, max) and replay time, the ratio of ``_base``'s
I/O time to the mount's at p50, the bytes the disk served the boots (the replay's and yolofs'
reads from storage, /proc/PID/io: not the stressors'), and
yolofs' CPU seconds per GiB it served and its resident memory.

``--catalogue N``: N images' boot images in the store and a memory budget that holds a quarter
of them; boots arrive ``--at-once`` at a time, each of an image drawn from a Zipf distribution
(exponent ``--zipf``) over the catalogue, through the mount only, beside each count of
``--stressors`` in turn (yolofs started afresh for each, the same draws). Reported:
the hit rate (a boot whose boot image was in memory), a boot's first read on a hit and on a
miss (a miss loads the boot image from the store on the HDD), evictions, and yolofs' memory per
boot image beyond its data: what an operator sizes the budget from.

``--reboot N``: a host back from a reboot. yolofs starts with nothing in memory (the page cache
dropped too) and N guests of distinct images start at once as soon as it is up, as Nova's
``resume_guests_state_on_host_boot`` starts them: without ``--preload``, each first open loads
its boot image; with it, yolofs loads its store meanwhile. Then ``--preload`` alone, with no
boot: its time, disk bytes, CPU and memory.
"""

import argparse
import json
import math
import pathlib
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

from prometheus_client.openmetrics import parser as openmetrics
import psutil

from yolo_bench import cloud
from yolo_bench import io_replay
from yolo_bench import plots
from yolo_bench import runner
from yolo_common import images
from yolo_common import qemu
from yolo_common import yolofs
from yolo_testing import ports
from yolo_testing import storage
from yolo_testing import stressors

# The goal (docs/evaluation/benchmarks.md, "Boot storms"): at 16 boots of distinct images at
# once on the HDD, the mount's boot I/O time at least this many times shorter than _base's...
GOAL_SPEEDUP = 10.0
GOAL_BOOTS = 16
# ... and its p99 within this factor of its p50.
GOAL_TAIL = 1.5
POLICIES = ('base', 'yolofs')


def traced_runs(reads):
    """The byte ranges a trace reads, merged: [(offset, end)], in offset order."""
    runs = []
    for offset, end in sorted((r.offset, r.offset + r.length) for r in reads):
        if runs and offset <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], end)
        else:
            runs.append([offset, end])
    return [tuple(run) for run in runs]


def write_synthetic_base(path, runs, size, seed, family=None, own_share=1.0):
    """A base file of ``size`` bytes holding random bytes where ``runs`` are, sparse elsewhere:
    its own (from ``seed``), or, for a member of ``family`` (a seed), the family's in all but
    ``own_share`` of its 4 KiB blocks, drawn at random, as one release's variants are."""
    family_bytes = random.Random(seed if family is None else family)
    own_bytes = random.Random(seed)
    choice = random.Random(-1 - seed)
    with open(path, 'wb') as f:
        f.truncate(size)
        for offset, end in runs:
            end = min(end, size)
            f.seek(offset)
            while offset < end:
                stop = min(end, (offset // SHARED_BLOCK + 1) * SHARED_BLOCK)
                # The family's bytes drawn in every member, so each has them at the same place.
                data = family_bytes.randbytes(stop - offset)
                if family is not None and choice.random() < own_share:
                    data = own_bytes.randbytes(stop - offset)
                f.write(data)
                offset = stop


# The block of boot images' data yolofs shares between boot images (its block pool).
SHARED_BLOCK = 4096


def run_bytes(runs):
    return sum(end - offset for offset, end in runs)


def process_cpu_seconds(pid):
    """User and system CPU seconds of process ``pid`` and its threads."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def resident_mib(pid):
    return psutil.Process(pid).memory_info().rss / (1 << 20)


def replay_in(disk, boots, factor):
    """The BootReplays of ``boots`` ((path, trace)) replayed at once by a process in the disk's
    cgroup, and the bytes that process read from storage."""
    proc = subprocess.run(
        [sys.executable, '-m', 'yolo_bench.io_replay', '--factor', str(factor), '--direct',
         *(str(item) for path, trace in boots for item in ('--boot', trace, path))],
        capture_output=True, text=True, preexec_fn=disk.join_cgroup)
    if proc.returncode:
        raise RuntimeError('the replay failed (%d): %s' % (proc.returncode, proc.stderr[-2000:]))
    replayed = json.loads(proc.stdout)
    return ([io_replay.BootReplay(**boot) for boot in replayed['boots']],
            replayed['storage_read_bytes'])


def zipf_draws(count, draws, exponent, seed=0):
    """``draws`` indexes of ``count`` items, the k-th most popular drawn in proportion to
    1 / k^exponent; which item is k-th is shuffled (by ``seed``)."""
    generator = random.Random(seed)
    ranked = list(range(count))
    generator.shuffle(ranked)
    weights = [1 / (k ** exponent) for k in range(1, count + 1)]
    return generator.choices(ranked, weights=weights, k=draws)


def scrape(port):
    """yolofs' metrics (OpenMetrics text): {family name: the sum of its samples}."""
    with urllib.request.urlopen('http://127.0.0.1:%d/metrics' % port, timeout=10) as answer:
        text = answer.read().decode()
    # A counter's value is its _total (not its _created); a gauge's, its own.
    return {family.name: sum(sample.value for sample in family.samples
                             if sample.name in (family.name, family.name + '_total'))
            for family in openmetrics.text_string_to_metric_families(text)}


class Storm:
    """The HDD, its base files and boot images, and the yolofs mount serving them."""

    def __init__(self, work, traces, image_size, count, stressor_count, budget_share=None,
                 mlock=True, families=None, own_share=1.0):
        # ``count`` base files, the i-th booting as traces[i % len(traces)]; the files of up to
        # ``stressor_count`` fio stressors; ``budget_share``: yolofs' memory budget as a share
        # of the boot images' bytes (None: room for every one). ``families``: the i-th base
        # file is a variant of family i % families, with ``own_share`` of its blocks its own.
        self.work = pathlib.Path(work)
        self.traces = list(traces)
        # Each trace's byte ranges, by trace.
        self.runs = {trace: traced_runs(io_replay.load_trace(trace)) for trace in self.traces}
        self.image_size = image_size
        self.count = count
        self.stressor_count = stressor_count
        # Each base file's written bytes and its boot image, the stressors' files, and room.
        needed = sum(2 * run_bytes(self.runs[self.trace_for(index)]) for index in range(count))
        needed += stressor_count * (stressors.STRESSOR_FILE_MIB << 20)
        self.disk = storage.ThrottledDisk(self.work / 'hdd',
                                          size_gib=max(4, math.ceil(needed * 1.2 / (1 << 30))))
        self.bases = []         # (base file, its trace)
        self.mount = None
        self.budget_share = budget_share
        self.memory_budget_mib = None
        self.mlock = mlock
        self.families = families
        self.own_share = own_share
        self.block_sharing = True
        self.metrics_port = ports.free_port()
        self.resident_before_loads_mib = None

    def __enter__(self):
        try:
            return self._set_up()
        except BaseException:
            self.__exit__()
            raise

    def _set_up(self):
        self.disk.setup()
        base_dir = self.disk.root / '_base'
        store = self.disk.root / 'boot-images'
        base_dir.mkdir()
        store.mkdir()
        runner.log('%d base files, %s MiB read by a boot, on a disk of %d GiB' % (
            self.count, ', '.join(str(run_bytes(self.runs[trace]) >> 20) for trace in self.traces),
            self.disk.size_gib))
        for index in range(self.count):
            trace = self.trace_for(index)
            base = base_dir / images.base_file_name(str(uuid.uuid4()))
            family = None if self.families is None else 1_000_000 + index % self.families
            write_synthetic_base(base, self.runs[trace], self.image_size, seed=index,
                                 family=family, own_share=self.own_share)
            yolofs.run('build', '--trace', trace, '--source', base,
                       '--output', store / (base.name + '.yolo'), '--mark')
            self.bases.append((base, trace))
        for index in range(self.stressor_count):
            storage.write_random(stressors.stressor_file(self.disk, index),
                                 stressors.STRESSOR_FILE_MIB)
        boot_images = sum(path.stat().st_size for path in store.glob('*.yolo'))
        share = self.budget_share or 1.0
        self.memory_budget_mib = max(1, math.ceil(boot_images * share / (1 << 20)))
        self.start_mount()
        return self

    def start_mount(self, preload=False, loads_at_once=None):
        """yolofs, started afresh: nothing in its memory (``preload``: it loads its store;
        ``loads_at_once``: its --loads-at-once, None for its default)."""
        if self.mount is not None:
            self.mount.stop()
        self.mount = yolofs.Mount(
            source=self.disk.root / '_base', mountpoint=self.work / 'mnt',
            boot_images=self.disk.root / 'boot-images', control_socket=self.work / 'yolofs.sock',
            log_path=self.work / 'yolofs.log', preexec_fn=self.disk.join_cgroup,
            mlock=self.mlock, no_kernel_passthrough=True, preload=preload,
            no_block_sharing=not self.block_sharing,
            loads_at_once=loads_at_once,
            memory_budget_mib=self.memory_budget_mib,
            metrics_address='127.0.0.1:%d' % self.metrics_port).start()
        self.resident_before_loads_mib = resident_mib(self.mount.process.pid)

    def sharing(self):
        """What the store's boot images hold, and hold in distinct 4 KiB blocks."""
        store = self.disk.root / 'boot-images'
        return json.loads(yolofs.run('shared', '--json', *sorted(store.glob('*.yolo'))).stdout)[
            'sharing']

    def trace_for(self, index):
        """The trace the index-th distinct image boots as: each in turn."""
        return self.traces[index % len(self.traces)]

    def through_mount(self, bases):
        """``bases`` ((base file, trace)), their files' paths through the mount."""
        return [(self.mount.mountpoint / base.name, trace) for base, trace in bases]

    def __exit__(self, *exc):
        if self.mount is not None:
            self.mount.stop()
        self.disk.teardown()

    def point(self, kind, boots, factor, stressor_count):
        """Both policies' replays of ``boots`` boots (``kind``: 'same' image or 'distinct'),
        beside ``stressor_count`` fio stressors."""
        bases = [self.bases[0]] * boots if kind == 'same' else self.bases[:boots]
        # In memory before the stressors start, as on every compute host (the budget holds every
        # boot image: loaded once, by the first point that uses it).
        for name in {base.name for base, _ in bases}:
            self.mount.client.request('preload', file=name, timeout=600)
        rows = []
        for policy in POLICIES:
            qemu.drop_caches()
            boots_of = bases if policy == 'base' else self.through_mount(bases)
            pid = self.mount.process.pid
            with stressors.io_stressors(self.disk, stressor_count):
                yolofs_before = io_replay.storage_read_bytes(pid)
                cpu_before = process_cpu_seconds(pid)
                results, replay_read = replay_in(self.disk, boots_of, factor)
                yolofs_read = io_replay.storage_read_bytes(pid) - yolofs_before
                cpu = process_cpu_seconds(pid) - cpu_before
            served = sum(r.bytes for r in results)
            # What the disk served the boots: the replay's own reads, and yolofs' for them.
            row = dict(io_replay.summary(results), policy=policy, kind=kind,
                       disk_bytes=replay_read + yolofs_read)
            if policy == 'yolofs':
                row.update(yolofs_cpu_seconds_per_gib=cpu / max(served / (1 << 30), 1e-9),
                           yolofs_rss_mib=resident_mib(pid))
            rows.append(row)
        return rows


# (name, --preload, every boot image loading at once rather than yolofs' default few)
REBOOT_VARIANTS = (('cold, loads all at once', False, True), ('cold', False, False),
                   ('preload', True, False), ('preload-alone', True, False))


def reboot(storm, guests, factor, timeout=600.0):
    """A host back from a reboot: yolofs starts with nothing in memory and ``guests`` boots of
    distinct images start as soon as it is up, without preloading ('cold': each load as its
    first open asks, all at once or yolofs' few at a time) and with it ('preload'); then
    preloading with no boot at all ('preload-alone'): what it costs."""
    rows = []
    for variant, preload, all_at_once in REBOOT_VARIANTS:
        qemu.drop_caches()
        storm.start_mount(preload=preload, loads_at_once=guests if all_at_once else None)
        pid = storm.mount.process.pid
        row = {'variant': variant, 'guests': guests, 'factor': factor}
        if variant != 'preload-alone':
            results, replay_read = replay_in(
                storm.disk, storm.through_mount(storm.bases[:guests]), factor)
            first_reads = [r.first_read for r in results]
            row.update(io_replay.summary(results), replay_disk_bytes=replay_read,
                       first_read_p50=io_replay.percentile(first_reads, 50),
                       first_read_max=max(first_reads))
        progress = wait_for_preload(storm.mount, timeout) if preload else None
        status = storm.mount.client.status().answer
        row.update(preload=progress, loaded=len(status['loaded']),
                   yolofs_disk_bytes=io_replay.storage_read_bytes(pid),
                   yolofs_cpu_seconds=process_cpu_seconds(pid), yolofs_rss_mib=resident_mib(pid))
        rows.append(row)
    return rows


def wait_for_preload(mount, timeout):
    """The mount's preload progress once done (bounded by ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        progress = mount.client.status().answer.get('preload')
        if progress and progress['done']:
            return progress
        if time.monotonic() > deadline:
            raise RuntimeError('preloading did not end within %g s: %s' % (timeout, progress))
        time.sleep(0.2)


def reboot_lines(rows):
    lines = ['variant                  guests  io p50   io max  first read p50 max  replay max  '
             'preload s  yolofs disk MiB  CPU s  RSS MiB']
    for row in rows:
        preload = row['preload']
        lines.append('{:<23} {:>7}  {:>6}  {:>7}  {:>8} {:>8}  {:>10}  {:>9}  {:>15.0f}  {:>5.1f}'
                     '  {:>7.0f}'.format(
                         row['variant'], row['guests'] if 'io_p50' in row else '-',
                         *(('%.3f' % row[key]) if key in row else '-' for key in (
                             'io_p50', 'io_max', 'first_read_p50', 'first_read_max',
                             'replay_max')),
                         '%.1f' % preload['seconds'] if preload else '-',
                         row['yolofs_disk_bytes'] / (1 << 20), row['yolofs_cpu_seconds'],
                         row['yolofs_rss_mib']))
    return lines


def catalogue(storm, arrivals, at_once, exponent, factor):
    """Boots of a Zipf mix of the storm's images, ``at_once`` at a time, through the mount:
    each boot's image, whether its boot image was in memory, its first read and its I/O time;
    and the evictions."""
    draws = zipf_draws(len(storm.bases), arrivals, exponent)
    before = scrape(storm.metrics_port)
    boots, status_seconds = [], []
    for start in range(0, len(draws), at_once):
        batch = draws[start:start + at_once]
        # A miss loads its boot image from the HDD, not from the page cache.
        qemu.drop_caches()
        # A hit: the boot image was in memory as the boot started. The status request lists
        # the whole store, cold: what nova-compute's periodic report costs on such a host.
        asked = time.monotonic()
        loaded = {entry['name'] for entry in storm.mount.client.status().answer['loaded']}
        status_seconds.append(time.monotonic() - asked)
        results, _ = replay_in(storm.disk, storm.through_mount([storm.bases[i] for i in batch]),
                               factor)
        for index, result in zip(batch, results):
            boots.append({'image': index, 'hit': storm.bases[index][0].name in loaded,
                          'first_read': result.first_read, 'io_seconds': result.io_seconds})
    after = scrape(storm.metrics_port)
    loaded = max(after['yolofs_boot_images_loaded'], 1)
    # The memory holding boot images' data: the block pool's slabs, or their own.
    data_memory = after.get('yolofs_block_pool_mapped_bytes', after['yolofs_memory_used_bytes'])
    return {'boots': boots, 'status_seconds': status_seconds,
            'images': len(storm.bases), 'at_once': at_once, 'zipf': exponent,
            'mlock': storm.mlock, 'memory_budget_mib': storm.memory_budget_mib,
            'block_sharing': storm.block_sharing,
            'loads': after['yolofs_boot_image_loads'] - before['yolofs_boot_image_loads'],
            'evictions': after['yolofs_boot_image_evictions']
            - before['yolofs_boot_image_evictions'],
            'memory_used_bytes': after['yolofs_memory_used_bytes'],
            'memory_unshared_bytes': after.get('yolofs_memory_unshared_bytes'),
            'block_pool_mapped_bytes': after.get('yolofs_block_pool_mapped_bytes'),
            # Beyond what it held before any load: index and bookkeeping per boot image.
            'rss_beyond_data_per_image_bytes':
                ((resident_mib(storm.mount.process.pid) - storm.resident_before_loads_mib)
                 * (1 << 20) - data_memory) / loaded}


def catalogue_lines(result):
    boots = result['boots']
    hits = [b['first_read'] for b in boots if b['hit']]
    misses = [b['first_read'] for b in boots if not b['hit']]

    def p50(values):
        return '%.3f s' % io_replay.percentile(values, 50) if values else '-'
    return [
        '%d images, a budget of %d MiB, %d boots %d at a time (Zipf %g), mlock %s, '
        'block sharing %s, %d stressors:' % (
            result['images'], result['memory_budget_mib'], len(boots), result['at_once'],
            result['zipf'], 'on' if result['mlock'] else 'off',
            'on' if result.get('block_sharing', True) else 'off', result.get('stressors', 0)),
        '  boots whose boot images were in memory: %d of %d (%.0f %%)' % (
            len(hits), len(boots), 100 * len(hits) / max(len(boots), 1)),
        '  first read, p50: %s in memory, %s loaded from the store' % (p50(hits), p50(misses)),
        '  loads %d, evictions %d; memory beyond boot image data: %.1f MiB per boot image' % (
            result['loads'], result['evictions'],
            result['rss_beyond_data_per_image_bytes'] / (1 << 20)),
        '  boot image data in memory at the end: %d MiB%s' % (
            result['memory_used_bytes'] >> 20,
            ' (%d MiB without sharing, %d MiB of slabs mapped)' % (
                result['memory_unshared_bytes'] >> 20, result['block_pool_mapped_bytes'] >> 20)
            if result.get('memory_unshared_bytes') is not None else ''),
        '  status of the whole store, caches dropped: %s p50, %.3f s max' % (
            p50(result['status_seconds']), max(result['status_seconds'], default=0.0))]


ROW = ('{stressors:>9}  {kind:<8} {boots:>3}  {b[io_p50]:6.2f} {b[io_p99]:6.2f} {b[io_max]:6.2f}'
       '   {y[io_p50]:6.3f} {y[io_p99]:6.3f} {y[io_max]:6.3f}  {ratio:6.1f}x'
       '  {base_mib:8.0f} {yolofs_mib:8.0f}  {y[yolofs_cpu_seconds_per_gib]:10.2f}'
       '  {y[yolofs_rss_mib]:7.0f}')


def table(points):
    """Lines: per point, _base's and the mount's I/O times, their ratio, the disk's bytes."""
    lines = ['stressors  images     N  base io p50 p99 max (s)  yolofs io p50 p99 max (s)   '
             'ratio  disk MiB: base yolofs  CPU s/GiB  RSS MiB']
    for point in points:
        lines.append(ROW.format(
            stressors=point['stressors'], kind=point['kind'], boots=point['boots'],
            b=point['base'], y=point['yolofs'], ratio=ratio(point),
            base_mib=point['base']['disk_bytes'] / (1 << 20),
            yolofs_mib=point['yolofs']['disk_bytes'] / (1 << 20)))
    return lines


def ratio(point):
    return point['base']['io_p50'] / max(point['yolofs']['io_p50'], 1e-9)


def goal(points):
    """Lines saying whether each point at GOAL_BOOTS distinct images meets the goal."""
    lines = []
    for point in points:
        if point['kind'] == 'distinct' and point['boots'] == GOAL_BOOTS:
            mine = point['yolofs']
            tail = mine['io_p99'] / max(mine['io_p50'], 1e-9)
            met = ratio(point) >= GOAL_SPEEDUP and tail <= GOAL_TAIL
            lines.append('goal at %d distinct images, %d stressors: %.1fx (>= %gx), p99/p50 '
                         '%.2f (<= %g): %s' % (
                             GOAL_BOOTS, point['stressors'], ratio(point), GOAL_SPEEDUP, tail,
                             GOAL_TAIL, 'met' if met else 'missed'))
    return lines


def numbers(text, least=0):
    try:
        values = [int(item) for item in text.split(',') if item]
    except ValueError:
        raise argparse.ArgumentTypeError('not comma-separated numbers: %r' % text)
    if not values or min(values) < least:
        raise argparse.ArgumentTypeError('not counts of at least %d: %r' % (least, text))
    return values


def positive(text):
    return numbers(text, least=1)


def one_positive(text):
    values = positive(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError('one count, not %r' % text)
    return values[0]


def run_catalogue(args, work, traces, size):
    """The catalogue beside each count of ``--stressors``, yolofs started afresh for each (its
    memory empty), the same draws."""
    results = []
    try:
        with Storm(work / 'catalogue', traces, size, args.catalogue, max(args.stressors),
                   budget_share=args.budget_share, mlock=args.mlock, families=args.families,
                   own_share=args.own_share) as storm:
            sharing = storm.sharing()
            runner.log('the boot images: %d MiB of data, %d MiB in distinct blocks (%.2fx)' % (
                sharing['data_bytes'] >> 20, sharing['distinct_bytes'] >> 20,
                sharing['data_bytes'] / max(sharing['distinct_bytes'], 1)))
            first = True
            for count in args.stressors:
                for block_sharing in args.block_sharing:
                    storm.block_sharing = block_sharing
                    if not first:   # the first point's mount has just started
                        storm.start_mount()
                    first = False
                    with stressors.io_stressors(storm.disk, count):
                        results.append(dict(
                            catalogue(storm, args.arrivals, args.at_once, args.zipf, args.factor),
                            stressors=count, families=args.families, own_share=args.own_share,
                            store_sharing=sharing))
                    print('\n'.join(catalogue_lines(results[-1])), flush=True)
    finally:
        if args.json:
            args.json.write_text(json.dumps(results, indent=1) + '\n')
    return 0


def run_reboot(args, work, traces, size):
    with Storm(work / 'reboot', traces, size, args.reboot, 0, mlock=args.mlock) as storm:
        rows = reboot(storm, args.reboot, args.factor)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + '\n')
    print('\n'.join(reboot_lines(rows)))
    return 0


def parse_args(argv):
    parser = argparse.ArgumentParser(prog='python -m yolo_bench.boot_storm',
                                     description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument('--trace', type=pathlib.Path, action='append',
                        help='a learned yolofs trace (v2); again for another image\'s')
    source.add_argument('--image', type=pathlib.Path, action='append',
                        help='a bootable qcow2 image whose boot is learned first; again for '
                             'another')
    parser.add_argument('--image-size', type=int,
                        help='bytes of each base file (default: the image\'s virtual size, '
                             'else the end of the last read)')
    parser.add_argument('--boots', type=positive, default=[1, 2, 4, 8, 16, 32, 64],
                        help='boots at once, comma-separated (default: 1,2,4,...,64)')
    parser.add_argument('--stressors', type=numbers, default=[0, 8],
                        help='fio stressors on the HDD, comma-separated (default: 0,8)')
    parser.add_argument('--kinds', type=cloud.comma_separated(('same', 'distinct'), 'kind'),
                        default=['same', 'distinct'], help='same image, distinct images')
    parser.add_argument('--factor', type=io_replay.factor, default=1.0,
                        help='think time scale: 1.0 is the learned boot\'s (default); \'kvm\' '
                             'makes a boot\'s think time %g s, as an idle KVM boot\'s'
                             % io_replay.KVM_BOOT_THINK_SECONDS)
    parser.add_argument('--catalogue', type=one_positive,
                        help='this many images, a memory budget for a share of them '
                             '(--budget-share), boots of a Zipf mix (instead of the storms)')
    parser.add_argument('--reboot', type=one_positive,
                        help='a host back from a reboot: this many guests of distinct images '
                             'start as yolofs starts, without and with --preload (instead of '
                             'the storms)')
    parser.add_argument('--arrivals', type=one_positive, default=400,
                        help='(default: %(default)s)')
    parser.add_argument('--at-once', type=one_positive, default=4, help='(default: %(default)s)')
    parser.add_argument('--zipf', type=float, default=1.0,
                        help='the Zipf exponent of the images\' popularity (default: 1.0)')
    parser.add_argument('--budget-share', type=float, default=0.25,
                        help='with --catalogue: yolofs\' memory budget as a share of the boot '
                             'images\' bytes (default: %(default)s)')
    parser.add_argument('--families', type=one_positive,
                        help='with --catalogue: the images are variants of this many families '
                             '(one release\'s variants), image i of family i %% FAMILIES')
    parser.add_argument('--own-share', type=float, default=0.5,
                        help='with --families: the share of a variant\'s 4 KiB blocks that are '
                             'its own (default: %(default)s)')
    parser.add_argument('--block-sharing', type=cloud.comma_separated(('on', 'off'), 'sharing'),
                        default=['on'],
                        help='with --catalogue: yolofs\' block pool on, off, or both in turn '
                             '(on,off), the same draws (default: on)')
    parser.add_argument('--no-mlock', dest='mlock', action='store_false',
                        help='boot images in memory not locked')
    parser.add_argument('--work', type=pathlib.Path, help='default: a temporary directory')
    parser.add_argument('--json', type=pathlib.Path, help='write every point to this file')
    parser.add_argument('--plot', type=pathlib.Path,
                        help='plot the storms\' I/O times to this PNG file')
    args = parser.parse_args(argv)
    if args.plot and (args.catalogue or args.reboot):
        parser.error('--plot plots storms, not --catalogue or --reboot')
    if args.families and args.families % len(args.trace or args.image):
        parser.error('--families: each family boots as one trace (a multiple of the traces)')
    args.block_sharing = [value == 'on' for value in args.block_sharing]
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    work = args.work or pathlib.Path(tempfile.mkdtemp(prefix='yolo-boot-storm-'))
    traces, size = args.trace, args.image_size
    if args.image:
        traces = []
        for index, image in enumerate(args.image):
            runner.log('learning the boot of %s' % image)
            traces.append(runner.learn_boot_image(image, work / ('image-%d' % index)))
        size = size or max(images.info(image)['virtual-size'] for image in args.image)
    ends = []
    for trace in traces:
        text = pathlib.Path(trace).read_text()
        reads = io_replay.parse_trace(text)
        ends.append(max(r.offset + r.length for r in reads))
        if not io_replay.timed(text) and args.factor:
            sys.exit('%s says nothing of when its reads came (a v1 trace): learn it again with '
                     'this yolofs, or replay it without think time (--factor 0)' % trace)
        runner.log('%s: %d reads of %d MiB, %.1f s of think time%s' % (
            trace, len(reads), sum(r.length for r in reads) >> 20,
            sum(r.think for r in reads), ', kvm factor %.4f' % io_replay.kvm_factor(reads)
            if args.factor == 'kvm' else ''))
    size = size or max(ends)
    if args.catalogue is not None:
        return run_catalogue(args, work, traces, size)
    if args.reboot is not None:
        return run_reboot(args, work, traces, size)
    points = []
    try:
        with Storm(work / 'storm', traces, size, max(args.boots), max(args.stressors)) as storm:
            for count in args.stressors:
                for kind in args.kinds:
                    for boots in args.boots:
                        started = time.monotonic()
                        base, mine = storm.point(kind, boots, args.factor, count)
                        points.append({'stressors': count, 'kind': kind, 'boots': boots,
                                       'factor': args.factor, 'base': base, 'yolofs': mine})
                        runner.log('%d stressors, %s, %d boots: %.1fx (%.0f s)' % (
                            count, kind, boots, ratio(points[-1]), time.monotonic() - started))
    finally:
        if args.json:
            args.json.write_text(json.dumps(points, indent=1) + '\n')
    print('\n'.join(table(points) + goal(points)))
    if args.plot:
        plots.storm_lines(points, args.plot)
    return 0


if __name__ == '__main__':
    sys.exit(main())
