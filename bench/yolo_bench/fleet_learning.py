"""Fleet learning through Nova on the all-in-one: what a boot image's next version serves.

    python -m yolo_bench.fleet_learning [--window 12] [--image-file F] [--json OUT]

The image is uploaded anew (public) with a short profiling window (``yolo_max_seconds``: the
profiling boot ends before the guest is ready, as a window closed too early would), so that its
published boot image (version 1) misses part of what the guests Nova boots read. Then:

1. on each compute host (``--availability-zone nova:HOST``) a first server, which caches the
   image and installs version 1, then (version 1 installed again as published: yolofs with
   ``--learn`` extends a boot image after a partial boot) a second: its coverage (the share of
   its reads yolofs served from the boot image: ``yolofs ctl stats``) and what it read outside;
2. the hosts report those reads at their next resource update, and the worker merges them:
   version 2 is published (waited for, and what the merge counted and added);
3. on each host, a server whose boot has the host install version 2 in place of version 1
   (its ``[yolo] boot_image_version_check_interval`` is 20 s on the all-in-one), then one more,
   served from version 2: its coverage.

The goal (issue "fleet learning"): at least 99 % of a boot's bytes served from memory after one
merge. Run as root with the all-in-one's venv and both compute hosts (bench/aio/fleet-learning).
"""

import argparse
import datetime
import json
import pathlib
import platform
import sys
import time

import openstack

from yolo_bench import cloud
from yolo_common import contract
from yolo_common import images
from yolo_common import yolofs
from yolo_testing import aio
from yolo_testing.wait import wait


def host_client(host):
    return yolofs.ControlClient(aio.CONTROL_SOCKETS[host])


def installed_id(host, name):
    """The Glance id of the boot image nova-compute on ``host`` installed for ``name``."""
    record = aio.INSTANCES[host] / 'yolo-incoming' / 'installed.json'
    try:
        return json.loads(record.read_text()).get(name)
    except (OSError, ValueError):
        return None


def install_published(admin, host, image, boot_image_id):
    """Has ``host``'s yolofs install published boot image ``boot_image_id`` of ``image`` as
    Glance holds it (verified against the base file, as nova-compute's installs are)."""
    path = aio.INSTANCES[host] / ('fleet-learning-%s.yolo' % boot_image_id)
    with open(path, 'wb') as out:
        admin.image.download_image(boot_image_id, output=out)
    try:
        host_client(host).install(images.base_file_name(image.id), path, image.id)
    finally:
        path.unlink()


def boot_on(admin, image, flavor, host, name, timeout, observed=True):
    """One server on ``host`` until its guest is ready; returns yolofs' record of the boot (its
    window ended: the guest read nothing for yolofs' idle gap), if ``observed``."""
    base = images.base_file_name(image.id)
    client = host_client(host)

    def boots():
        try:
            return client.stats(base).get(base, {}).get('boots') or []
        except yolofs.YolofsError:
            return []
    started = time.time()
    cloud.boot_servers(admin, admin, image, flavor, name, 1, timeout,
                       availability_zone='nova:%s' % host, keep_seconds=5)
    if not observed:
        return None
    # The window ends after yolofs' idle gap (the guest deleted: no more reads). yolofs keeps
    # a file's last 8 boots: this one is the one that started after the request.
    record = wait('the boot window on %s' % host, 300, lambda: [
        b for b in boots() if b['started_unix'] >= started - 1] or None)[-1]
    return {'host': host, 'coverage': record['coverage'],
            'bytes_memory': record['bytes_memory'],
            'bytes_passthrough': record['bytes_passthrough'],
            'outside_bytes': sum(length for _, length in record.get('outside') or ()),
            'outside_extents': len(record.get('outside') or ())}


def properties(admin, image_id):
    return admin.image.get_image(image_id).properties or {}


def linked(admin, image):
    """The boot image the image links, with its properties."""
    boot_image_id = properties(admin, image.id).get(contract.BOOT_IMAGE_ID)
    return boot_image_id, properties(admin, boot_image_id) if boot_image_id else {}


def parse_args(argv):
    parser = argparse.ArgumentParser(prog='python -m yolo_bench.fleet_learning',
                                     description=__doc__.splitlines()[0])
    parser.add_argument('--window', type=float, default=12.0,
                        help="the profiling boot's window, seconds (the image's "
                             'yolo_max_seconds; default: %(default)s)')
    parser.add_argument('--admin-cloud', default='aio-admin')
    parser.add_argument('--image-file', type=pathlib.Path,
                        help='qcow2 to upload (default: tools/build-test-image.sh)')
    parser.add_argument('--flavor', default='m1.yolo')
    parser.add_argument('--timeout', type=float, default=1800.0)
    parser.add_argument('--json', type=pathlib.Path, help='where to write the figures')
    cloud.ready_pattern_option(parser)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cloud.set_ready_pattern(args.ready_pattern)
    admin = openstack.connect(cloud=args.admin_cloud)

    def computes():
        return {s.host for s in admin.compute.services(binary='nova-compute')
                if s.state == 'up' and s.status == 'enabled'}
    # A host just added reports up at its first heartbeat.
    try:
        wait('both compute hosts up', 120, lambda: set(aio.HOSTS) <= computes(), interval=5.0)
    except TimeoutError:
        sys.exit('both compute hosts must be up (tools/aio/aio add-compute): %s are'
                 % ', '.join(sorted(computes())))
    flavor = admin.compute.find_flavor(args.flavor)
    name = 'fleet-learning-%s' % datetime.datetime.now().strftime('%Y%m%d-%H%M%S')
    image = cloud.public_image(admin, name, args.image_file)
    admin.image.update_image(image, **{contract.MAX_SECONDS: '%g' % args.window})
    print('==> %s uploaded; waiting for its boot image (profiling window %g s)'
          % (image.id, args.window), flush=True)
    first_id = cloud.wait_for_boot_image(admin, image, args.timeout)
    version_1 = properties(admin, first_id)
    base = images.base_file_name(image.id)

    before = []
    for number, host in enumerate(aio.HOSTS, 1):
        # The host's first boot of the image caches it and installs version 1 (the first host
        # boots it after Nova's download, from _base; the second before it, over the fill).
        print('==> first boot on %s (untimed)' % host, flush=True)
        boot_on(admin, image, flavor, host, '%s-first-%d' % (name, number), args.timeout,
                observed=False)
        wait('version 1 installed on %s' % host, 300,
             lambda: installed_id(host, base) == first_id, interval=2.0)
        # yolofs (--learn) extends a boot image after a partial boot: version 1 as published
        # again, so that the next boot measures it.
        install_published(admin, host, image, first_id)
        print('==> boot %d on %s, from version 1' % (number, host), flush=True)
        before.append(boot_on(admin, image, flavor, host, '%s-%d' % (name, number),
                              args.timeout))
        print('    coverage %.4f, %d bytes outside in %d extents' % (
            before[-1]['coverage'], before[-1]['outside_bytes'], before[-1]['outside_extents']),
            flush=True)
    print('==> waiting for the hosts\' reports and the merge', flush=True)
    merged_at = time.monotonic()
    second_id = wait('version 2', 900, lambda: (
        lambda linked_id, props: linked_id if props.get(contract.VERSION) == '2' else None)(
            *linked(admin, image)), interval=5.0)
    merge_seconds = time.monotonic() - merged_at
    version_2 = properties(admin, second_id)

    after = []
    for host in aio.HOSTS:
        print('==> a boot on %s moves it to version 2' % host, flush=True)
        boot_on(admin, image, flavor, host, '%s-move-%s' % (name, host), args.timeout)
        wait('version 2 installed on %s' % host, 300,
             lambda: installed_id(host, base) == second_id, interval=2.0)
        print('==> boot on %s, from version 2' % host, flush=True)
        after.append(boot_on(admin, image, flavor, host, '%s-after-%s' % (name, host),
                             args.timeout))
        print('    coverage %.4f, %d bytes outside' % (after[-1]['coverage'],
                                                       after[-1]['outside_bytes']), flush=True)

    figures = {
        'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
        'machine': '%s, %s' % (platform.node(), platform.platform()),
        'image': image.id, 'profiling_window_seconds': args.window,
        'version_1': {'id': first_id, 'covered_bytes': int(version_1[contract.COVERED_BYTES]),
                      'window_ended_by': version_1.get(contract.WINDOW_ENDED_BY)},
        'version_2': {'id': second_id, 'covered_bytes': int(version_2[contract.COVERED_BYTES]),
                      'merged_hosts': int(version_2[contract.MERGED_HOSTS]),
                      'merged_boots': int(version_2[contract.MERGED_BOOTS]),
                      'merged_bytes': int(version_2[contract.MERGED_BYTES]),
                      'seconds_from_last_boot_to_published': round(merge_seconds, 1)},
        'boots_before': before, 'boots_after': after,
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + '\n')
    worst = min(boot['coverage'] for boot in after)
    print('==> coverage of a boot: %s from version 1, %s from version 2 (goal: at least 0.99)'
          % (', '.join('%.4f' % b['coverage'] for b in before),
             ', '.join('%.4f' % b['coverage'] for b in after)))
    return 0 if worst >= 0.99 else 1


if __name__ == '__main__':
    sys.exit(main())
