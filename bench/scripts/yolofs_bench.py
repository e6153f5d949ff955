"""yolofs micro-benchmarks, measured side by side in one run.

1. Passthrough overhead: fio on the source file directly vs through yolofs for a file without a
   boot image, served by the kernel (FUSE passthrough) and by the daemon (``--no-kernel-
   passthrough``: what reads outside a boot image cost), for sequential 1 MiB reads and random
   4 KiB reads at queue depth 1 and 16, with a cold and a warm page cache. Runs alternate between
   the targets and repeat; ratios of medians are reported (target / direct throughput).
2. Reads served from a loaded boot image: the same fio jobs on a file entirely covered by a boot
   image, against the same file read directly (cold and warm), its data in the block pool
   shared between boot images and, beside it, in memory of its own (``--no-block-sharing``).
3. The test image: its sizes, the bytes one boot reads, the boot image, the time to learn it, and
   the block-size trade-off: boot images built at several block sizes from one boot's trace, and
   how much of a second boot's reads each covers.

Usage: python3 bench/scripts/yolofs_bench.py [--workdir DIR] [--repeats N] [--runtime S]
       [--skip-passthrough] [--skip-boots]
Prints a Markdown report (and writes it, with the raw figures as JSON, to --out).
"""

import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import sys
import time
import uuid

from checkout import REPO  # noqa: E402 (makes the checkout importable)

from yolo_bench import io_replay  # noqa: E402
from yolo_common import images  # noqa: E402
from yolo_common import learning  # noqa: E402
from yolo_common import qemu  # noqa: E402
from yolo_common import yolofs  # noqa: E402
from yolo_testing import storage  # noqa: E402

# Random reads of a cold run: a share of the file small enough that few blocks are read twice.
COLD_RANDOM_IO = '64M'
# (name, fio arguments). QD16 uses libaio with O_DIRECT, as QEMU does with cache=none.
WORKLOADS = [
    ('seq-1M-qd1', ['--rw=read', '--bs=1M', '--ioengine=psync', '--iodepth=1']),
    ('rand-4k-qd1', ['--rw=randread', '--bs=4k', '--ioengine=psync', '--iodepth=1']),
    ('rand-4k-qd16', ['--rw=randread', '--bs=4k', '--ioengine=libaio', '--iodepth=16',
                      '--direct=1']),
]


def fio(path, args, runtime, cold):
    """One fio run. Cold: one pass over fresh data (sequential: the whole file once; random:
    ``COLD_RANDOM_IO`` of it), so the page cache cannot serve a second pass. Warm: time-based."""
    if cold:
        sequential = '--rw=read' in args
        amount = [] if sequential else ['--io_size=%s' % COLD_RANDOM_IO]
    else:
        amount = ['--time_based', '--runtime=%d' % runtime]
    out = subprocess.run(
        ['fio', '--name=bench', '--filename=%s' % path, '--readonly', '--output-format=json',
         '--randrepeat=1', '--invalidate=0', *amount, *args],
        check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index('{'):])['jobs'][0]['read']
    return {'bw_mib_s': job['bw_bytes'] / 2**20, 'iops': job['iops'],
            'lat_us': job['clat_ns']['mean'] / 1000}


def warm(path):
    with open(path, 'rb') as f:
        while f.read(8 << 20):
            pass


def compare(targets, repeats, runtime, log):
    """fio on each target (name -> (path, prepare)) per workload and cache state, alternating."""
    results = []
    for workload, args in WORKLOADS:
        for cache in ('cold', 'warm'):
            runs = {name: [] for name in targets}
            for _ in range(repeats):
                for name, (path, before) in targets.items():
                    qemu.drop_caches()
                    if before:
                        before()
                    if cache == 'warm':
                        warm(path)
                    runs[name].append(fio(path, args, runtime, cache == 'cold'))
            row = {'workload': workload, 'cache': cache}
            for name, values in runs.items():
                row[name] = {key: statistics.median(v[key] for v in values)
                             for key in values[0]}
                row[name + '_range'] = [min(v['bw_mib_s'] for v in values),
                                        max(v['bw_mib_s'] for v in values)]
            results.append(row)
            log('%-13s %-4s %s' % (workload, cache, '  '.join(
                '%s %.1f MiB/s %.0f us' % (n, row[n]['bw_mib_s'], row[n]['lat_us'])
                for n in targets)))
    return results


def read_trace(path):
    return [(read.offset, read.length) for read in io_replay.load_trace(path)]


def coverage(boot_image, reads):
    """Fraction of the bytes of ``reads`` that ``boot_image`` covers."""
    info = json.loads(yolofs.run('inspect', '--json', '--extents', boot_image).stdout)
    extents = sorted((e['source_offset'], e['source_offset'] + e['length'])
                     for e in info['extents'])
    import bisect
    starts = [s for s, _ in extents]
    covered = total = 0
    for offset, length in reads:
        end = offset + length
        total += length
        i = max(bisect.bisect_right(starts, offset) - 1, 0)
        while i < len(extents) and extents[i][0] < end:
            s, e = extents[i]
            covered += max(0, min(e, end) - max(s, offset))
            i += 1
    return covered / total if total else 0.0, info


def test_image_section(work, log):
    image = subprocess.run([str(REPO / 'tools' / 'build-test-image.sh')], check=True,
                           capture_output=True, text=True).stdout.split()[-1]
    base_dir = work / '_base'
    base_dir.mkdir()
    base = base_dir / images.base_file_name(str(uuid.uuid4()))
    images.convert_to_raw(image, base)
    learned = []
    for boot in (1, 2):
        log('learning from boot %d' % boot)
        qemu.drop_caches()
        learned.append(learning.learn_boot_image(base, work / ('learn%d' % boot)))
    trace1, boot_image1, trace2 = learned[0].trace, learned[0].boot_image, learned[1].trace
    timing = {'boot_seconds': learned[0].boot_seconds,
              'build_seconds': learned[0].build_seconds}
    reads1, reads2 = read_trace(trace1), read_trace(trace2)
    result = {
        'image_qcow2_bytes': pathlib.Path(image).stat().st_size,
        'base_raw_bytes': base.stat().st_size,
        'base_allocated_bytes': base.stat().st_blocks * 512,
        'boot_reads': len(reads1),
        'boot_read_bytes': sum(length for _, length in reads1),
        'boot_image_bytes': boot_image1.stat().st_size,
        'timing': timing,
        'second_boot_seconds': learned[1].boot_seconds,
        'block_sizes': [],
    }
    for block_size in (4096, 16384, 65536, 262144):
        out = work / ('bs%d.yolo' % block_size)
        yolofs.run('build', '--trace', trace1, '--source', base, '--output', out,
                   '--block-size', block_size)
        covered, info = coverage(out, reads2)
        result['block_sizes'].append({
            'block_size': block_size, 'boot_image_bytes': out.stat().st_size,
            'extents': info['extent_count'], 'second_boot_coverage': covered})
        log('block %6d: %6.1f MiB, %5d extents, covers %.2f%% of boot 2' % (
            block_size, out.stat().st_size / 2**20, info['extent_count'], 100 * covered))
    return result


def passthrough_section(work, source, store, report, args, log):
    """Section 1: a file without a boot image, direct and through yolofs (kernel and daemon)."""
    with yolofs.Mount(source=work / 'src', mountpoint=work / 'mnt', boot_images=store,
                      control_socket=work / 'ctl.sock', log_path=work / 'yolofs.log') as kernel, \
            yolofs.Mount(source=work / 'src', mountpoint=work / 'mnt-daemon', boot_images=store,
                         control_socket=work / 'ctl-daemon.sock',
                         log_path=work / 'yolofs-daemon.log', no_kernel_passthrough=True) as daemon:
        assert kernel.client.status().answer['kernel_passthrough'], \
            'the kernel offers no passthrough'
        log('passthrough overhead (%d MiB file)' % args.file_mib)
        report['passthrough'] = compare(
            {'direct': (source, None), 'kernel': (kernel.mountpoint / 'file', None),
             'daemon': (daemon.mountpoint / 'file', None)},
            args.repeats, args.runtime, log)


def compare_loads(mounts, repeats):
    """The median seconds a preload of the boot image ``covered`` takes on each of ``mounts``
    (name -> mount), evicted first and the page cache dropped, the mounts in turn."""
    seconds = {name: [] for name in mounts}
    for _ in range(repeats):
        for name, mount in mounts.items():
            mount.client.evict('covered')
            qemu.drop_caches()
            started = time.monotonic()
            mount.client.preload('covered')
            seconds[name].append(time.monotonic() - started)
    return {name: statistics.median(values) for name, values in seconds.items()}


def fmt_rows(rows, base, others):
    """A table: throughput (median, min-max) and mean latency per target, ratios to ``base``."""
    names = [base, *others]
    head = ['workload', 'cache'] + ['%s MiB/s' % n for n in names] + \
        ['%s / %s' % (n, base) for n in others] + ['%s lat (us)' % n for n in names]
    lines = ['| ' + ' | '.join(head) + ' |', '|---|---|' + '---:|' * (len(head) - 2)]
    for r in rows:
        cells = [r['workload'], r['cache']]
        cells += ['%.1f (%.1f-%.1f)' % (r[n]['bw_mib_s'], *r[n + '_range']) for n in names]
        cells += ['**%.2f**' % (r[n]['bw_mib_s'] / r[base]['bw_mib_s']) for n in others]
        cells += ['%.1f' % r[n]['lat_us'] for n in names]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--workdir', type=pathlib.Path, default=pathlib.Path('/var/tmp/yolo-bench'))
    parser.add_argument('--file-mib', type=int, default=1024)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--runtime', type=int, default=6, help='seconds per fio run')
    parser.add_argument('--skip-passthrough', action='store_true')
    parser.add_argument('--skip-boots', action='store_true')
    parser.add_argument('--out', type=pathlib.Path, default=REPO / 'results' / 'yolofs-bench')
    args = parser.parse_args()

    def log(message):
        print('==> ' + message, file=sys.stderr, flush=True)

    work = args.workdir
    if work.exists():
        for mnt in work.glob('mnt*'):
            subprocess.run(['fusermount3', '-uz', str(mnt)], capture_output=True)
        shutil.rmtree(work)
    (work / 'src').mkdir(parents=True)
    report = {'started': time.strftime('%Y-%m-%d %H:%M:%S'), 'args': vars(args) | {
        'workdir': str(work), 'out': str(args.out)}}
    store = work / 'store'
    store.mkdir()

    if not args.skip_passthrough:
        source = work / 'src' / 'file'
        storage.write_random(source, args.file_mib)
        passthrough_section(work, source, store, report, args, log)

    covered = work / 'src' / 'covered'
    storage.write_random(covered, 256)
    trace = work / 'full.trace'
    trace.write_text('0 %d\n' % (256 << 20))
    yolofs.run('build', '--trace', trace, '--source', covered, '--output',
               store / 'covered.yolo', '--mark')
    # The same boot image in a store of its own for the mount whose boot images keep their
    # memory apart.
    unshared_store = work / 'store-unshared'
    unshared_store.mkdir()
    shutil.copy(store / 'covered.yolo', unshared_store / 'covered.yolo')
    with yolofs.Mount(source=work / 'src', mountpoint=work / 'mnt2', boot_images=store,
                      control_socket=work / 'ctl2.sock', log_path=work / 'yolofs2.log',
                      mlock=True) as mount, \
            yolofs.Mount(source=work / 'src', mountpoint=work / 'mnt3', boot_images=unshared_store,
                         control_socket=work / 'ctl3.sock', log_path=work / 'yolofs3.log',
                         mlock=True, no_block_sharing=True) as unshared:
        log('reads from a loaded boot image (256 MiB, locked in RAM; in the block pool and not)')
        mount.client.preload('covered')
        unshared.client.preload('covered')
        assert 'block_pool' in mount.client.status().answer
        report['boot_image'] = compare(
            {'direct': (covered, None),
             'boot_image': (mount.mountpoint / 'covered',
                            lambda: mount.client.preload('covered')),
             'unshared': (unshared.mountpoint / 'covered',
                          lambda: unshared.client.preload('covered'))},
            args.repeats, args.runtime, log)
        for m in (mount, unshared):
            stats = m.client.stats('covered')['covered']
            assert stats['bytes_passthrough'] == 0, stats
        log('loading the boot image (evicted, the page cache dropped), in the pool and not')
        report['load'] = compare_loads({'boot_image': mount, 'unshared': unshared},
                                       max(args.repeats, 5))
        log('  '.join('%s %.3f s' % (name, seconds) for name, seconds in report['load'].items()))

    if not args.skip_boots:
        log('test image: learning and block sizes')
        report['test_image'] = test_image_section(work, log)

    lines = []
    if 'passthrough' in report:
        lines += ['## Passthrough overhead (no boot image)', '',
                  fmt_rows(report['passthrough'], 'direct', ['kernel', 'daemon']), '']
    lines += ['## Reads served from a loaded boot image', '',
              fmt_rows(report['boot_image'], 'direct', ['boot_image', 'unshared']), '',
              'Loading it (256 MiB, median): %s' % ', '.join(
                  '%s %.3f s' % item for item in report['load'].items()), '']
    if 'test_image' in report:
        t = report['test_image']
        lines += ['## The test image', '',
                  '| figure | value |', '|---|---:|',
                  '| image (qcow2, compressed) | %.1f MiB |' % (t['image_qcow2_bytes'] / 2**20),
                  '| base file (raw) | %.0f MiB (%.0f MiB allocated) |' % (
                      t['base_raw_bytes'] / 2**20, t['base_allocated_bytes'] / 2**20),
                  '| reads in one boot | %d |' % t['boot_reads'],
                  '| bytes one boot reads | %.1f MiB |' % (t['boot_read_bytes'] / 2**20),
                  '| boot image (4 KiB blocks) | %.1f MiB |' % (t['boot_image_bytes'] / 2**20),
                  '| learning boot | %.1f s |' % t['timing']['boot_seconds'],
                  '| building the boot image after the boot | %.2f s |' % (
                      t['timing']['build_seconds']),
                  '', '| block size | boot image | extents | covers of a second boot\'s reads |',
                  '|---:|---:|---:|---:|']
        lines += ['| %d KiB | %.1f MiB | %d | %.2f%% |' % (
            b['block_size'] // 1024, b['boot_image_bytes'] / 2**20, b['extents'],
            100 * b['second_boot_coverage']) for b in t['block_sizes']]
    text = '\n'.join(lines) + '\n'
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix('.md').write_text(text)
    args.out.with_suffix('.json').write_text(json.dumps(report, indent=1))


if __name__ == '__main__':
    main()
