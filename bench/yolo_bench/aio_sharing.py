"""Cross-image block sharing through Nova on the all-in-one: an image and images derived from it,
booted on one compute host, their boot images installed by nova-compute.

    python -m yolo_bench.aio_sharing [--derive nginx-light --derive redis-server] [--json OUT]

The test image and images derived from it (``tools/derive-image.sh``: each with a package
installed, as users customise an image) are uploaded anew (public); the worker builds each one's
boot image from its profiling boot. Then a server of each boots on the first compute host: Nova
caches the image and installs its boot image (yolofs packs it in its store), and a second server
of each boots from it. Reported: what the host's yolofs holds of them on disk (its block file
against the boot images' data) and in memory (its block pool against the same), and each boot's
share of bytes served from memory. Run as root with the all-in-one's venv
(bench/aio/block-sharing).
"""

import argparse
import datetime
import json
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

import openstack

from yolo_bench import cloud
from yolo_bench import fleet_learning
from yolo_common import images
from yolo_testing import aio
from yolo_testing.wait import wait

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_image():
    return pathlib.Path(subprocess.run(
        [str(REPO / 'tools' / 'build-test-image.sh')], check=True, capture_output=True,
        text=True).stdout.splitlines()[-1])


def derived_image(base, package, work):
    output = work / ('derived-%s.qcow2' % package)
    subprocess.run([str(REPO / 'tools' / 'derive-image.sh'), str(base), str(output), package],
                   check=True, stdout=subprocess.DEVNULL)
    return output


def parse_args(argv):
    parser = argparse.ArgumentParser(prog='python -m yolo_bench.aio_sharing',
                                     description=__doc__.splitlines()[0])
    parser.add_argument('--derive', action='append',
                        help='a package each derived image installs (default: nginx-light, '
                             'redis-server)')
    parser.add_argument('--admin-cloud', default='aio-admin')
    parser.add_argument('--flavor', default='m1.yolo')
    parser.add_argument('--timeout', type=float, default=1800.0)
    parser.add_argument('--json', type=pathlib.Path, help='where to write the figures')
    cloud.ready_pattern_option(parser)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cloud.set_ready_pattern(args.ready_pattern)
    admin = openstack.connect(cloud=args.admin_cloud)
    flavor = admin.compute.find_flavor(args.flavor)
    host = aio.HOSTS[0]
    client = fleet_learning.host_client(host)
    stamp = datetime.datetime.now().strftime('%Y%m%d-%H%M%S')
    base_file = test_image()
    with tempfile.TemporaryDirectory(prefix='yolo-sharing-', dir='/var/tmp') as work:
        files = {'base': base_file}
        for package in args.derive or ['nginx-light', 'redis-server']:
            print('==> deriving an image with %s' % package, flush=True)
            files[package] = derived_image(base_file, package, pathlib.Path(work))
        uploaded = {label: cloud.public_image(admin, 'sharing-%s-%s' % (label, stamp), path)
                    for label, path in files.items()}
    before = client.status().answer.get('block_file') or {}
    boots = []
    for label, image in uploaded.items():
        print('==> %s (%s): waiting for its boot image' % (label, image.id), flush=True)
        boot_image_id = cloud.wait_for_boot_image(admin, image, args.timeout)
        base = images.base_file_name(image.id)
        print('==> a first server of %s on %s (caches the image, installs its boot image)'
              % (label, host), flush=True)
        fleet_learning.boot_on(admin, image, flavor, host, 'sharing-%s-first' % label,
                               args.timeout, observed=False)
        wait('the boot image of %s installed on %s' % (label, host), 300,
             lambda: fleet_learning.installed_id(host, base) == boot_image_id, interval=2.0)
        started = time.monotonic()
        boot = fleet_learning.boot_on(admin, image, flavor, host, 'sharing-%s' % label,
                                      args.timeout)
        boot.update(image=label, seconds=round(time.monotonic() - started, 1))
        boots.append(boot)
        print('    served from memory: %.4f of its bytes' % boot['coverage'], flush=True)
    status = client.status().answer
    after = status.get('block_file') or {}
    on_disk = {key: after.get(key, 0) - before.get(key, 0)
               for key in ('boot_images', 'image_bytes', 'blocks', 'bytes')}
    pool = status.get('block_pool') or {}
    figures = {
        'date': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds'),
        'machine': '%s, %s' % (platform.node(), platform.platform()),
        'host': host, 'images': {label: image.id for label, image in uploaded.items()},
        'block_file_added': on_disk, 'block_file': after, 'block_pool': pool,
        'memory_used_bytes': status['memory_used_bytes'], 'boots': boots,
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + '\n')
    mib = 1 << 20
    print('==> on disk: %d boot images, %d MiB of data in %d MiB of blocks (%.2fx)' % (
        on_disk['boot_images'], on_disk['image_bytes'] // mib, on_disk['bytes'] // mib,
        on_disk['image_bytes'] / max(on_disk['bytes'], 1)))
    print('==> in memory: %d MiB of boot images in %d MiB of the block pool (%.2fx)' % (
        pool.get('charged_image_bytes', 0) // mib, pool.get('charged_bytes', 0) // mib,
        pool.get('charged_image_bytes', 0) / max(pool.get('charged_bytes', 0), 1)))
    return 0 if on_disk['boot_images'] == len(uploaded) else 1


if __name__ == '__main__':
    sys.exit(main())
