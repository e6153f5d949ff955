"""First boots of a public image through Nova on the all-in-one cloud, Glance behind a rate limit:
``openstack server create`` to the guest's ready marker (docs/first-boot.md).

    python -m yolo_bench.first_boots [--rates 1000,100] [--rounds 3] [--image-format qcow2]
                                     [--large] [--store ceph]

Every boot runs on the all-in-one's second compute host (tools/aio/aio add-compute: the one with
``[yolo] first_boot_before_download`` on), created by the admin with ``--availability-zone
nova:aio-compute-2`` and ``--nic none``. Each round boots, in an order rotated per round:

* ``cached``: ``_base`` holds the base file and yolofs its boot image (any later boot of the
  image there);
* ``nova``: the base file deleted and YOLO off (the host's yolofs stopped): Nova downloads the
  whole image from Glance (and converts it to raw), then the guest starts;
* ``yolo``: the base file and the boot image deleted: the driver fetches the boot image from
  Glance, starts the guest over the base file being filled, and fills it in the background. The
  next boot waits for the fill to end (the base file there and its boot image installed).

Glance's data is slowed down where it leaves glance-api: an HTB class of ``rate`` Mbit/s on the
loopback device for the packets from Glance's port (``tc``; everything else on the loopback
device goes unthrottled), which every download from Glance shares, as a compute host's link
would carry them. The page cache is dropped before each boot.

``--large``: the test image grown to 8 GiB virtual with 2 GiB of random data beyond its file
system (data a boot never reads, which a full download carries), booted with a flavor of an
8 GB disk (``m1.yolo-8g``, created if missing).

Run as root with the all-in-one's venv (bench/aio/first-boot-times does both).
"""

import argparse
import contextlib
import os
import pathlib
import statistics
import subprocess
import sys
import time

import openstack

from yolo_bench import cloud
from yolo_bench import scheduling
from yolo_common import images
from yolo_common import yolofs
from yolo_testing import aio
from yolo_testing import REPO
from yolo_testing.wait import wait

MODES = ('cached', 'nova', 'yolo')
GLANCE_PORT = 9292
COMPUTE_LOG = aio.LOG_DIR / 'nova-compute-2.log'
HOST = scheduling.SECOND_HOST
CONTROL_SOCKET = aio.CONTROL_SOCKETS[HOST]
GiB = 1 << 30
LARGE_FLAVOR = 'm1.yolo-8g'


def grow_with_random_data(raw, size=8 * GiB, data_at=6 * GiB, data=2 * GiB):
    """The raw image ``raw`` grown to ``size`` bytes, with ``data`` random bytes at ``data_at``
    (beyond the test image's file system: bytes no boot reads)."""
    with open(raw, 'r+b') as f:
        f.truncate(size)
        f.seek(data_at)
        for _ in range(data >> 20):
            f.write(os.urandom(1 << 20))


def tc(*args, check=True):
    return subprocess.run(['tc'] + [str(arg) for arg in args], check=check,
                          capture_output=True, text=True)


@contextlib.contextmanager
def glance_link(device='lo', port=GLANCE_PORT, address=None):
    """A link of settable rate for what glance-api sends (packets from ``port`` on ``device``,
    and from ``address`` alone if given: what it sends to the clients that reach it there);
    yields the function that sets its rate in Mbit/s. The device's root qdisc is restored (none)
    at the end."""
    # replace: a root qdisc a killed run left is replaced, not added to.
    tc('qdisc', 'replace', 'dev', device, 'root', 'handle', '1:', 'htb', 'default', '20')
    try:
        # Loopback packets are up to 64 KiB (its MTU), so the bursts are a few of them.
        tc('class', 'add', 'dev', device, 'parent', '1:', 'classid', '1:20', 'htb',
           'rate', '100gbit', 'burst', '1mb')

        def set_rate(mbit):
            tc('class', 'replace', 'dev', device, 'parent', '1:', 'classid', '1:10', 'htb',
               'rate', '%dmbit' % mbit, 'ceil', '%dmbit' % mbit, 'burst', '256kb', 'cburst',
               '256kb')
        set_rate(100000)
        source = ('match', 'ip', 'src', '%s/32' % address) if address else ()
        tc('filter', 'add', 'dev', device, 'parent', '1:', 'protocol', 'ip', 'prio', '1', 'u32',
           *source, 'match', 'ip', 'sport', port, '0xffff', 'flowid', '1:10')
        yield set_rate
    finally:
        tc('qdisc', 'del', 'dev', device, 'root', check=False)


class Host:
    """The second compute host of the all-in-one as the benchmark changes it."""

    def __init__(self, image):
        self.name = HOST
        self.base = scheduling.INSTANCES[HOST] / '_base' / images.base_file_name(image.id)
        self.client = yolofs.ControlClient(CONTROL_SOCKET)

    def cached(self):
        """Whether the base file is there and yolofs has an unrefused boot image of it (which
        it verifies again when a guest starts: libvirt's changes of the base file's owner
        leave it unverified meanwhile)."""
        if not self.base.exists():
            return False
        try:
            return self.client.status().usable(self.base.name)
        except (OSError, ValueError, yolofs.YolofsError):
            return False

    def forget(self):
        """A host that never had the image: no base file, no boot image."""
        self.base.unlink(missing_ok=True)
        self.client.prune()

    def set_yolofs(self, on):
        subprocess.run([str(aio.AIO), 'start-yolofs-2' if on else 'stop-yolofs-2'],
                       check=True, stdout=subprocess.DEVNULL)

    def make_cached(self, admin, image, flavor, timeout):
        """An untimed boot, if need be, after which the host has the base file and yolofs its
        boot image."""
        if not self.cached():
            print('==> untimed boot on %s' % self.name, flush=True)
            boot(admin, image, flavor, self.name, 'first-boots-untimed', timeout)
            wait('boot image on %s' % self.name, timeout, self.cached, interval=2.0)


def logged(path, since):
    with open(path) as log:
        log.seek(since)
        return log.read()


def boot(admin, image, flavor, host, name, timeout):
    """One server on ``host``: seconds from its creation to its guest's ready line."""
    cloud.drop_caches()
    _, ready, _ = cloud.boot_servers(admin, admin, image, flavor, name, 1, timeout,
                                     availability_zone='nova:%s' % host)
    return ready


def summary(results):
    """The table: per link rate, the median boot of each mode and the median of each first
    boot's ratio to the cached boot of its round. ``results``: {(rate, mode): [seconds, ...]}."""
    lines = ['| Glance link | cached boot | Nova first boot | YOLO first boot | Nova / cached | '
             'YOLO / cached |', '|---|---|---|---|---|---|']
    for rate in dict.fromkeys(rate for rate, _ in results):
        median = {mode: statistics.median(results[rate, mode]) for mode in MODES}
        ratio = {mode: statistics.median([boot_s / cached for boot_s, cached in zip(
            results[rate, mode], results[rate, 'cached'])]) for mode in ('nova', 'yolo')}
        lines.append('| %d Mbit/s | %.1f s | %.1f s | %.1f s | %.2fx | %.2fx |'
                     % (rate, median['cached'], median['nova'], median['yolo'], ratio['nova'],
                        ratio['yolo']))
    return '\n'.join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog='python -m yolo_bench.first_boots',
                                     description=__doc__.splitlines()[0])
    parser.add_argument('--rates', default='1000,100',
                        help='rates of Glance\'s link, Mbit/s, comma-separated '
                             '(default: %(default)s)')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--image-format', choices=('qcow2', 'raw'), default='qcow2',
                        help='the public image as Glance stores it: the test image (qcow2: '
                             'reads outside its boot image wait for the whole download and '
                             'conversion), or a raw copy of it (they are fetched by range)')
    parser.add_argument('--admin-cloud', default='aio-admin')
    parser.add_argument('--image', default='debian12-yolo')
    parser.add_argument('--large', action='store_true',
                        help='the test image grown to 8 GiB with 2 GiB of data beyond its file '
                             'system (uploaded as IMAGE-large[-raw] if missing)')
    parser.add_argument('--flavor',
                        help='(default: m1.yolo, with --large %s)' % LARGE_FLAVOR)
    parser.add_argument('--store', default=None,
                        help="Glance's store for the image (the all-in-one's: fs, file, its "
                             "default; ceph, rbd, which serves no ranges: YOLO's first boot is "
                             "then Nova's); the image is uploaded as IMAGE-STORE")
    parser.add_argument('--output', help='a CSV file each boot is appended to')
    parser.add_argument('--timeout', type=float, default=1800.0)
    cloud.ready_pattern_option(parser)
    return parser.parse_args(argv)


def public_image(admin, name, disk_format, large, store=None):
    """The public image to boot: the test image as built (qcow2), or made raw, or grown
    (``large``), in Glance's store ``store``; uploaded if missing as ``name`` with ``-large``,
    ``-raw`` and ``-STORE`` appended."""
    name += (('-large' if large else '') + ('-raw' if disk_format == 'raw' else '')
             + ('-' + store if store else ''))
    if disk_format == 'qcow2' and not large:
        return cloud.public_image(admin, name, store=store)
    image = admin.image.find_image(name)
    if image is None:
        test_image = pathlib.Path(subprocess.run(
            [str(REPO / 'tools' / 'build-test-image.sh')], check=True,
            capture_output=True, text=True).stdout.splitlines()[-1])
        raw = pathlib.Path('/var/tmp/first-boots-%s.raw' % name)
        upload = raw.with_suffix('.' + disk_format)
        try:
            images.convert_to_raw(test_image, raw)
            if large:
                grow_with_random_data(raw)
            if disk_format == 'qcow2':
                subprocess.run(['qemu-img', 'convert', '-f', 'raw', '-O', 'qcow2', str(raw),
                                str(upload)], check=True)
            image = cloud.public_image(admin, name, upload, disk_format, store)
        finally:
            raw.unlink(missing_ok=True)
            upload.unlink(missing_ok=True)
    return image


def boot_flavor(admin, name, large):
    """The flavor ``name``; by default the all-in-one's, or for the large image one whose disk
    holds it (created if missing)."""
    if name:
        return admin.compute.find_flavor(name, ignore_missing=False)
    if not large:
        return admin.compute.find_flavor('m1.yolo', ignore_missing=False)
    return (admin.compute.find_flavor(LARGE_FLAVOR)
            or admin.compute.create_flavor(name=LARGE_FLAVOR, ram=1024, vcpus=1, disk=8))


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cloud.set_ready_pattern(args.ready_pattern)
    admin = openstack.connect(cloud=args.admin_cloud)

    def second_host_up():
        return any(s.host == HOST and s.state == 'up' and s.status == 'enabled'
                   for s in admin.compute.services(binary='nova-compute'))

    try:
        # A host just restarted is reported up at its first report (every 10 s).
        wait('nova-compute on %s up' % HOST, 120, second_host_up, interval=5.0)
    except TimeoutError:
        sys.exit('this benchmark boots on the all-in-one\'s second compute host (tools/aio/aio '
                 'add-compute), which is not up')
    image = public_image(admin, args.image, args.image_format, args.large, args.store)
    image = admin.image.get_image(image.id)     # as Glance has it now (its size)
    print('==> image %s (%s, %.1f MiB in Glance\'s store %s); waiting for its boot image'
          % (image.name, image.disk_format, image.size / (1 << 20),
             admin.image.get('/images/%s' % image.id).json().get('stores')), flush=True)
    cloud.wait_for_boot_image(admin, image, args.timeout)
    flavor = boot_flavor(admin, args.flavor, args.large)
    host = Host(image)
    results = {}
    without_ranges = False
    if args.output and not os.path.exists(args.output):
        with open(args.output, 'w') as out:
            out.write('time,store,rate_mbit,round,mode,ready_seconds\n')
    with glance_link() as set_rate:
        for rate in [int(rate) for rate in args.rates.split(',')]:
            set_rate(rate)
            for round_ in range(args.rounds):
                for mode in MODES[round_ % 3:] + MODES[:round_ % 3]:
                    if mode == 'cached':
                        host.make_cached(admin, image, flavor, args.timeout)
                    else:
                        host.forget()
                    if mode == 'nova':
                        host.set_yolofs(False)
                    since = COMPUTE_LOG.stat().st_size
                    try:
                        ready = boot(admin, image, flavor, host.name,
                                     'first-boots-%s-%d-%d' % (mode, rate, round_), args.timeout)
                    finally:
                        if mode == 'nova':
                            host.set_yolofs(True)
                    filled = ''
                    if mode == 'yolo':
                        # The next boot waits for the fill to end and its boot image to be
                        # installed: the host is then in the cached state.
                        started = time.monotonic()
                        wait('the base file and boot image on %s' % host.name,
                             args.timeout, host.cached, interval=2.0)
                        filled = ' (its fill ended %.0f s later)' % (time.monotonic() - started)
                        # Booted before the download, not by Nova's normal path, unless the
                        # store serves no ranges (rbd): then Nova's path, by design.
                        log = logged(COMPUTE_LOG, since)
                        # (probed once per image and nova-compute process, said once)
                        without_ranges = without_ranges or (
                            'does not serve image %s by range' % image.id
                            in logged(COMPUTE_LOG, 0))
                        if 'Filled base file %s' % host.base.name not in log \
                                and not without_ranges:
                            sys.exit('the YOLO boot did not fill its base file: see %s'
                                     % COMPUTE_LOG)
                        if without_ranges:
                            filled += " (Glance's store serves no ranges: Nova's path)"
                    results.setdefault((rate, mode), []).append(ready)
                    if args.output:
                        with open(args.output, 'a') as out:
                            out.write('%s,%s,%d,%d,%s,%.1f\n' % (
                                time.strftime('%Y-%m-%dT%H:%M:%S'), args.store or 'default',
                                rate, round_, mode, ready))
                    print('%5d Mbit/s round %d %-6s ready after %6.1f s%s'
                          % (rate, round_, mode, ready, filled), flush=True)
    print()
    print(summary(results))
    return 0


if __name__ == '__main__':
    sys.exit(main())
