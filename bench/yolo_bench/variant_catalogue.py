"""A catalogue of real image variants, and what their boot images take with and without sharing.

    sudo env PYTHONPATH=.:bench:testing .venv/bin/python -m yolo_bench.variant_catalogue \
        --work /var/tmp/variants --json docs/evaluation/data/variant-catalogue.json

Builds the images of ``CATALOGUE`` from Debian's packages, as a cloud's users make them: test
images debootstrapped apart (``tools/build-test-image.sh``: other package sets, Debian 12 and
Debian 11), images derived from one by installing packages into it
(``tools/derive-image.sh``), and snapshots of servers: an image booted, left running for a
while, stopped and its disk converted, as Nova's snapshot of a server is. Learns each image's
boot image from one real boot (yolofs record mode, as the worker's profiling boot), then reports
for each group of images (one release's, the derivatives of one image, ...):

- their boot images' data and what it takes in distinct 4 KiB blocks (``yolofs shared``);
- a yolofs store the group's boot images are installed in (as Nova installs them) and a mount
  that has them all loaded, with sharing (the store's block file, the block pool) and with
  ``--no-block-sharing``, each afresh: the store's disk space (its files' blocks), the time to
  load them all, one after another, the page cache dropped, from this machine's disk or the
  emulated HDD (``--disk hdd``), and the bytes the mount holds in memory (``status``) and its
  resident memory.

The images and their boot images stay in ``--work``: a second run builds and learns only what
is missing there.
"""

import argparse
import collections
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import uuid

import psutil

from yolo_bench import io_replay
from yolo_bench import runner
from yolo_common import images
from yolo_common import learning
from yolo_common import qemu
from yolo_common import yolofs

REPO = pathlib.Path(__file__).resolve().parents[2]

Variant = collections.namedtuple('Variant', 'name how parent packages command',
                                 defaults=(None, (), None))

# Application data a server keeps on its disk (a web site's content), written by a derivation.
SITE_CONTENT = ('mkdir -p /var/www/html/media && for i in $(seq 1 200); do '
                'head -c 65536 /dev/urandom > /var/www/html/media/$i.bin; done')

# how: 'build' (tools/build-test-image.sh; name RELEASE-VARIANT), 'derive' (packages installed
# into the parent, then the command) or 'snapshot' (the parent booted, then its disk).
CATALOGUE = (
    Variant('bookworm-standard', 'build'),
    Variant('bookworm-cloud-kernel', 'build'),
    Variant('bookworm-sysvinit', 'build'),
    Variant('bookworm-services', 'build'),
    Variant('bookworm-cloud-init', 'build'),
    Variant('bookworm-nginx', 'derive', 'bookworm-standard', ('nginx-light',)),
    Variant('bookworm-postgresql', 'derive', 'bookworm-standard', ('postgresql',)),
    Variant('bookworm-redis', 'derive', 'bookworm-standard', ('redis-server',)),
    Variant('bookworm-apache', 'derive', 'bookworm-standard', ('apache2',)),
    Variant('bookworm-memcached', 'derive', 'bookworm-standard', ('memcached',)),
    Variant('bookworm-haproxy', 'derive', 'bookworm-standard', ('haproxy',)),
    Variant('bookworm-python', 'derive', 'bookworm-standard', ('python3', 'python3-flask')),
    Variant('bookworm-nginx-php', 'derive', 'bookworm-nginx', ('php-fpm',)),
    Variant('bookworm-nginx-site', 'derive', 'bookworm-nginx', (), SITE_CONTENT),
    Variant('bookworm-standard-snapshot', 'snapshot', 'bookworm-standard'),
    Variant('bookworm-nginx-snapshot', 'snapshot', 'bookworm-nginx'),
    Variant('bookworm-postgresql-snapshot', 'snapshot', 'bookworm-postgresql'),
    Variant('bookworm-nginx-site-snapshot', 'snapshot', 'bookworm-nginx-site'),
    Variant('bookworm-nginx-snapshot-2', 'snapshot', 'bookworm-nginx-snapshot'),
    Variant('bullseye-standard', 'build'),
    Variant('bullseye-nginx', 'derive', 'bullseye-standard', ('nginx-light',)),
    Variant('bullseye-postgresql', 'derive', 'bullseye-standard', ('postgresql',)),
    Variant('bullseye-standard-snapshot', 'snapshot', 'bullseye-standard'),
)

# A server snapshotted this long after its guest was ready: its services have started and
# written what they write at a start.
SERVER_RUNS_SECONDS = 30


def family(name, catalogue=CATALOGUE):
    """The image a variant was built from with debootstrap, at the root of its derivations."""
    by_name = {v.name: v for v in catalogue}
    while by_name[name].parent:
        name = by_name[name].parent
    return name


def groups(catalogue=CATALOGUE):
    """The sets of images the report measures: (name, [image names])."""
    names = [v.name for v in catalogue]
    out = [('all', names)]
    for release in sorted({n.split('-')[0] for n in names}):
        out.append(('%s (one release)' % release, [n for n in names if n.startswith(release)]))
    out.append(('debootstrapped apart', [v.name for v in catalogue if v.how == 'build']))
    for root in sorted({family(n, catalogue) for n in names}):
        members = [n for n in names if family(n, catalogue) == root]
        if len(members) > 1:
            out.append(('%s and its derivatives' % root, members))
    return out


def build(variant, images_dir, base_dir):
    """The variant's raw disk in ``base_dir`` (built unless there)."""
    raw = base_dir / variant.name
    if raw.exists():
        return raw
    partial = base_dir / (variant.name + '.tmp')
    started = time.monotonic()
    if variant.how == 'build':
        release, kind = variant.name.split('-', 1)
        env = dict(os.environ, YOLO_DEBIAN_RELEASE=release, YOLO_IMAGE_VARIANT=kind)
        qcow2 = subprocess.run([str(REPO / 'tools' / 'build-test-image.sh')], env=env,
                               check=True, capture_output=True, text=True).stdout.split()[-1]
        images.convert_to_raw(qcow2, partial)
    elif variant.how == 'derive':
        env = dict(os.environ)
        if variant.command:
            env['YOLO_DERIVE_COMMAND'] = variant.command
        qcow2 = images_dir / (variant.name + '.qcow2')
        subprocess.run([str(REPO / 'tools' / 'derive-image.sh'), str(base_dir / variant.parent),
                        str(qcow2), *variant.packages], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        images.convert_to_raw(qcow2, partial)
        qcow2.unlink()
    else:
        snapshot(base_dir / variant.parent, partial, images_dir)
    partial.rename(raw)
    runner.log('%s: built (%s) in %.0f s' % (variant.name, variant.how,
                                             time.monotonic() - started))
    return raw


def snapshot(parent, output, scratch):
    """A snapshot of a server of ``parent``: booted on an overlay, run for a while, stopped,
    its disk (the overlay over ``parent``) converted to one raw file."""
    overlay = scratch / (output.name + '.overlay.qcow2')
    images.create_overlay(parent, overlay)
    try:
        with qemu.Guest(overlay, cache='writeback') as guest:
            guest.wait_ready(runner.BOOT_TIMEOUT)
            time.sleep(SERVER_RUNS_SECONDS)
        images.convert_to_raw(overlay, output, fmt='qcow2')
    finally:
        overlay.unlink(missing_ok=True)


def learn(raw, learn_dir, store):
    """The boot image of ``raw`` (one profiling boot), in ``store``, with its stamp."""
    boot_image = store / (raw.name + '.yolo')
    if boot_image.exists():
        return boot_image
    started = time.monotonic()
    learned = learning.learn_boot_image(raw, learn_dir, boot_timeout=runner.BOOT_TIMEOUT,
                                        cache=runner.LEARNING_CACHE_MODE)
    for path in (learned.boot_image, learned.boot_image.with_name(raw.name + '.yolo.verified'),
                 learned.trace):
        shutil.move(str(path), str(store / path.name))
    runner.log('%s: learned in %.0f s' % (raw.name, time.monotonic() - started))
    return boot_image


def shared(boot_images):
    return json.loads(yolofs.run('shared', '--json', *boot_images).stdout)['sharing']


def in_store(base_dir, store, names, work, disk, block_sharing):
    """Installs the boot images of ``names`` in a fresh yolofs store on ``disk``, as Nova
    installs them, and loads them all: what they take on disk and in memory then."""
    group_store = disk.root / 'group-store'
    shutil.rmtree(group_store, ignore_errors=True)
    mount = yolofs.Mount(source=base_dir, mountpoint=work / 'mnt', boot_images=group_store,
                         control_socket=work / 'yolofs.sock', log_path=work / 'yolofs.log',
                         preexec_fn=disk.join_cgroup, memory_budget_mib=64 * 1024,
                         no_block_sharing=not block_sharing)
    with mount:
        for name in names:
            mount.client.install(name, store / (name + '.yolo'),
                                 str(uuid.uuid5(uuid.NAMESPACE_URL, name)))
        files = [path for path in group_store.iterdir() if path.is_file()]
        disk = sum(path.stat().st_blocks * 512 for path in files)
        resident_before = psutil.Process(mount.process.pid).memory_info().rss
        # Loaded from the disk, one after another (the stamps written at install hold: no
        # base file is read).
        qemu.drop_caches()
        started = time.monotonic()
        for name in names:
            with open(mount.mountpoint / name, 'rb') as f:
                f.read(4096)
        load_seconds = time.monotonic() - started
        status = mount.client.request('status')
        resident = psutil.Process(mount.process.pid).memory_info().rss - resident_before
    loaded = {entry['name'] for entry in status['loaded']}
    if loaded != set(names):
        raise RuntimeError('yolofs loaded %s of %s (rejected: %s)'
                           % (sorted(loaded), names, status['rejected']))
    return {'disk_bytes': disk, 'block_file': status.get('block_file'),
            'load_seconds': round(load_seconds, 3),
            'memory_used_bytes': status['memory_used_bytes'],
            'block_pool': status.get('block_pool'), 'resident_bytes': resident}


def measure(base_dir, store, work, disk, catalogue=CATALOGUE):
    rows = []
    for label, names in groups(catalogue):
        files = [store / (name + '.yolo') for name in names]
        sharing = shared(files)
        row = {'group': label, 'images': names,
               'data_bytes': sharing['data_bytes'],
               'distinct_block_bytes': sharing['distinct_bytes'],
               'boot_image_bytes': sum(f.stat().st_size for f in files),
               'pool': in_store(base_dir, store, names, work, disk, True),
               'apart': in_store(base_dir, store, names, work, disk, False)}
        rows.append(row)
        runner.log(line(row))
    return rows


def line(row):
    pool, apart = row['pool'], row['apart']
    mib = 1 << 20
    return ('%s, %d images: boot image data %d MiB, distinct 4 KiB blocks %d MiB (%.2fx); '
            'on disk %d MiB packed against %d MiB whole (%.2fx); loaded in %.2f s against '
            '%.2f s; in memory %d MiB with the pool (%d MiB resident) against %d MiB apart '
            '(%d MiB resident): %.2fx' % (
                row['group'], len(row['images']), row['data_bytes'] // mib,
                row['distinct_block_bytes'] // mib,
                row['data_bytes'] / row['distinct_block_bytes'],
                pool['disk_bytes'] // mib, apart['disk_bytes'] // mib,
                apart['disk_bytes'] / pool['disk_bytes'],
                pool['load_seconds'], apart['load_seconds'],
                pool['block_pool']['bytes'] // mib, pool['resident_bytes'] // mib,
                apart['memory_used_bytes'] // mib, apart['resident_bytes'] // mib,
                apart['memory_used_bytes'] / pool['block_pool']['bytes']))


def intervals_bytes(intervals):
    """Bytes covered by (start, end) intervals, overlaps counted once."""
    total, reach = 0, 0
    for start, end in sorted(intervals):
        start = max(start, reach)
        if end > start:
            total += end - start
            reach = end
    return total


def covered(reads, extents):
    """Bytes of ``reads`` ((start, end)) inside ``extents`` ((start, end)), each byte once."""
    reads, extents = sorted(reads), sorted(extents)
    merged = []
    for start, end in reads:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    total, i = 0, 0
    for start, end in merged:
        while i < len(extents) and extents[i][1] <= start:
            i += 1
        j = i
        while j < len(extents) and extents[j][0] < end:
            total += min(end, extents[j][1]) - max(start, extents[j][0])
            j += 1
    return total


def extents_of(boot_image):
    answer = json.loads(yolofs.run('inspect', '--json', '--extents', boot_image).stdout)
    return [(e['source_offset'], e['source_offset'] + e['length']) for e in answer['extents']]


def relative_starts(base_dir, store, work, catalogue=CATALOGUE):
    """For each image made from another: the boot image built from its relative's
    (``yolofs build --like``) against its own boot's reads."""
    rows = []
    for variant in catalogue:
        if not variant.parent:
            continue
        like = work / 'scratch' / (variant.name + '.like.yolo')
        yolofs.run('build', '--like', store / (variant.parent + '.yolo'),
                   '--source', base_dir / variant.name, '--output', like)
        trace = (store / (variant.name + '.trace')).read_text()
        reads = [(r.offset, r.offset + r.length) for r in io_replay.parse_trace(trace)]
        boot_bytes = intervals_bytes(reads)
        start = extents_of(like)
        start_bytes = intervals_bytes(start)
        useful = covered(reads, start)
        rows.append({'image': variant.name, 'relative': variant.parent, 'how': variant.how,
                     'boot_bytes': boot_bytes, 'start_bytes': start_bytes,
                     'useful_bytes': useful, 'coverage': useful / boot_bytes,
                     'own_boot_image_bytes': intervals_bytes(
                         extents_of(store / (variant.name + '.yolo')))})
        runner.log('%s from %s: the start holds %d MiB, %.1f %% of its boot\'s %d MiB; '
                   '%.1f %% of it is read' % (
                       variant.name, variant.parent, start_bytes >> 20, 100 * useful / boot_bytes,
                       boot_bytes >> 20, 100 * useful / max(start_bytes, 1)))
    return rows


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--work', type=pathlib.Path, default=pathlib.Path('/var/tmp/variants'),
                        help='where the images and boot images are kept between runs')
    parser.add_argument('--only', action='append',
                        help='build and learn only these variants (and their parents)')
    parser.add_argument('--disk', choices=('local', 'hdd'), default='local',
                        help="the stores' disk: this machine's, or the emulated HDD")
    parser.add_argument('--json', type=pathlib.Path, help='write the measurements here')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    base_dir, store = args.work / '_base', args.work / 'boot-images'
    for directory in (base_dir, store, args.work / 'scratch'):
        directory.mkdir(parents=True, exist_ok=True)
    catalogue = CATALOGUE
    if args.only:
        wanted = set()
        for name in args.only:
            while name:
                wanted.add(name)
                name = {v.name: v for v in CATALOGUE}[name].parent
        catalogue = tuple(v for v in CATALOGUE if v.name in wanted)
    for variant in catalogue:
        build(variant, args.work / 'scratch', base_dir)
    for variant in catalogue:
        learn(base_dir / variant.name, args.work / 'learn', store)
    starts = relative_starts(base_dir, store, args.work, catalogue)
    disk = runner.make_disk(args.disk, args.work).setup()
    try:
        rows = measure(base_dir, store, args.work, disk, catalogue)
    finally:
        disk.teardown()
    if args.json:
        args.json.write_text(json.dumps({'date': time.strftime('%Y-%m-%d'),
                                         'disk': disk.describe(),
                                         'catalogue': [v._asdict() for v in catalogue],
                                         'relative_starts': starts,
                                         'groups': rows}, indent=1) + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
