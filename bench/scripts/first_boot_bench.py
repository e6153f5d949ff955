"""The first boot of an image on a compute host: YOLO's, before the download, against Nova's,
after it, and a boot with the image already cached (docs/first-boot.md).

Nova's image backend as nova-compute runs it (YoloLibvirtDriver's, with Nova's configuration and
in-process privsep), a real yolofs mount, real qemu-img, and QEMU boots under TCG with
``cache=none``, one at a time. Glance's image download is yolo_testing.image_server: the image, raw
(as Glance stores it for Ceph and as Nova caches it), and its boot image, over one link of
``--rates`` Mbit/s that every connection shares. Each round boots, in an order rotated per round:

* ``cached``: ``_base`` holds the base file and yolofs its boot image (any later boot);
* ``nova``: ``_base`` empty, YOLO off: Nova downloads the whole image over the link
  (``images.fetch_to_raw`` through its image API, which is the emulated Glance), then creates
  the disk, and the guest boots;
* ``yolo``: ``_base`` empty, ``first_boot_before_download`` on: the boot image over the link,
  the disk over the base file being filled, the guest boots while the fill downloads the rest.

Reported: seconds from Nova's ``Image.cache()`` (where the driver's spawn makes the root disk) to
the guest's ready line, and each first boot's ratio to the cached boot of its round. The page
cache is dropped before each boot; the next boot waits for the fill. The boot image is learned
first, by one boot of the image on a learning mount, as the Glance worker learns one.

Usage (as root):
    python3 bench/scripts/first_boot_bench.py [--rates 1000,100] [--rounds 3] [--image test|large]

``--image large``: the test image grown to 8 GiB with 2 GiB of random data beyond its file system
(data a boot never reads, which a full download carries).
"""

import argparse
import contextlib
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
import uuid

from checkout import REPO  # noqa: E402 (makes the checkout importable)

# Native threads, no eventlet, and Nova's test environment, as the functional tests have them.
import tests.conftest  # noqa: E402,F401
import tests.nova_env  # noqa: E402,F401

import fixtures  # noqa: E402
from keystoneauth1 import session as ks_session  # noqa: E402
import nova.conf  # noqa: E402
from nova import context as nova_context  # noqa: E402
from nova import objects  # noqa: E402
from nova.tests import fixtures as nova_fixtures  # noqa: E402
from nova.tests.unit import fake_instance  # noqa: E402
from nova.virt import driver as virt_driver  # noqa: E402
from nova.virt import fake as fake_virt  # noqa: E402
from nova.virt.libvirt import utils as libvirt_utils  # noqa: E402
from oslo_config import fixture as config_fixture  # noqa: E402

from yolo_bench import first_boots  # noqa: E402
from yolo_common import images  # noqa: E402
from yolo_common import learning  # noqa: E402
from yolo_common import qemu  # noqa: E402
from yolo_common import yolofs  # noqa: E402
from yolo_nova import conf as yolo_conf  # noqa: E402
from yolo_nova.virt import boot_images  # noqa: E402
from yolo_nova.virt import first_boot  # noqa: E402
from yolo_testing.image_server import ImageServer  # noqa: E402

CONF = nova.conf.CONF
yolo_conf.register_opts(CONF)
MODES = ('cached', 'nova', 'yolo')
IMAGE_ID = '5e0f3c2a-8b1d-4c7e-9a6f-2d4b8c1e0a93'
BOOT_IMAGE_ID = 'b0075e0f-3c2a-4b1d-8c7e-9a6f2d4b8c1e'
PUBLISHER = 'yolo-service'
GiB = 1 << 30
BOOT_TIMEOUT = 1800


class EmulatedGlance:
    """Glance as Nova's image API and the driver's service identity see it: the image's and the
    boot image's records, and their data from the image server (over its link)."""

    project_id = PUBLISHER

    def __init__(self, server, image_size, image_sha256, boot_image_size):
        self.server = server
        self.records = {
            IMAGE_ID: {'id': IMAGE_ID, 'owner': 'a-tenant', 'status': 'active',
                       'container_format': 'bare', 'disk_format': 'raw', 'size': image_size,
                       'os_hash_algo': 'sha256', 'os_hash_value': image_sha256,
                       'properties': {boot_images.BOOT_IMAGE_PROPERTY: BOOT_IMAGE_ID}},
            BOOT_IMAGE_ID: {'id': BOOT_IMAGE_ID, 'owner': PUBLISHER, 'status': 'active',
                            'container_format': 'yolo', 'disk_format': 'raw',
                            'size': boot_image_size,
                            'properties': {boot_images.SOURCE_IMAGE_PROPERTY: IMAGE_ID}},
        }

    def get(self, context, image_id, *args, **kwargs):
        return dict(self.records[image_id])

    def data(self, image_id):
        return first_boot.GlanceData(ks_session.Session(), self.server.endpoint, image_id)

    def download(self, context, image_id, data=None, dest_path=None, **kwargs):
        with open(dest_path, 'wb') as out:
            for chunk in self.data(image_id).chunks():
                out.write(chunk)


def drop_caches():
    subprocess.run(['sync'], check=True)
    pathlib.Path('/proc/sys/vm/drop_caches').write_text('3\n')


def make_glance_data(workdir, image, large):
    """The image as Glance serves it, raw: the test image, or the large one."""
    raw = workdir / 'glance-image.raw'
    images.convert_to_raw(image, raw)
    if large:
        first_boots.grow_with_random_data(raw)
    digest = hashlib.sha256()
    with open(raw, 'rb') as f:
        while chunk := f.read(16 << 20):
            digest.update(chunk)
    return raw, digest.hexdigest()


class Host:
    """One compute host's instances directory, yolofs mount and Nova configuration."""

    def __init__(self, workdir, scope):
        self.instances = workdir / 'instances'
        self.base_dir = self.instances / '_base'
        self.base_dir.mkdir(parents=True)
        self.name = images.base_file_name(IMAGE_ID)
        self.mount = scope.enter_context(yolofs.Mount(
            source=self.base_dir, mountpoint=workdir / 'mnt', boot_images=workdir / 'store',
            control_socket=workdir / 'control.sock', log_path=workdir / 'yolofs.log'))
        self.conf = scope.enter_context(fixtures.Fixture()).useFixture(
            config_fixture.Config(CONF))
        self.conf.config(instances_path=str(self.instances), use_cow_images=True,
                         force_raw_images=True)
        self.conf.config(images_type='qcow2', virt_type='qemu', group='libvirt')
        self.conf.config(mount_point=str(self.mount.mountpoint),
                         control_socket=str(self.mount.control_socket),
                         download_dir=str(workdir / 'downloads'), detach_after_boot=False,
                         group='yolo')
        self.workdir = workdir
        self.context = nova_context.get_admin_context()

    def driver(self, glance, mode):
        self.conf.config(enabled=mode != 'nova', first_boot_before_download=mode == 'yolo',
                         group='yolo')
        drvr = virt_driver.load_compute_driver(fake_virt.FakeVirtAPI(), 'yolo.YoloLibvirtDriver')
        drvr.yolo_boot_images._image_api = glance
        drvr.yolo_boot_images._boot_image_api = glance
        return drvr

    def forget_image(self):
        """A host that never had the image: no base file, no boot image."""
        (self.base_dir / self.name).unlink(missing_ok=True)
        self.mount.client.prune()

    def cache_image(self, glance_raw, published):
        """A host that has booted the image before: its base file and boot image."""
        if not (self.base_dir / self.name).exists():
            shutil.copyfile(glance_raw, self.base_dir / self.name)
        if self.name not in self.mount.client.status().boot_images:
            self.mount.client.install(self.name, published, IMAGE_ID)

    def boot(self, drvr, console):
        """Nova's root disk for a new instance, then its boot: (seconds from the disk's
        creation to ready, seconds the disk's creation took)."""
        instance = fake_instance.fake_instance_obj(
            self.context, uuid=str(uuid.uuid4()), image_ref=IMAGE_ID,
            flavor=objects.Flavor(root_gb=10, ephemeral_gb=0, swap=0, extra_specs={}))
        instance.system_metadata, instance.numa_topology = {}, None
        instance.trusted_certs = None
        disk = drvr.image_backend.by_name(instance, 'disk')
        drop_caches()
        started = time.monotonic()
        disk.cache(fetch_func=libvirt_utils.fetch_image, context=self.context,
                   filename=self.name, image_id=IMAGE_ID, size=10 * GiB)
        created = time.monotonic() - started
        # What a start does: the disk's backing file placed (the mount, or _base if YOLO is off).
        drvr._yolo_place_backing_files(
            "<domain><devices><disk type='file' device='disk'><driver name='qemu' "
            "type='qcow2'/><source file='%s'/></disk></devices></domain>" % disk.path, instance)
        with qemu.Guest(disk.path, console_log=console) as guest:
            guest.wait_ready(BOOT_TIMEOUT)
            ready = guest.ready_at - started
        shutil.rmtree(pathlib.Path(disk.path).parent)
        return ready, created


def learn_boot_image(workdir, glance_raw):
    """The boot image the Glance worker would publish: learned as it learns one (one boot on a
    learning mount, its window ended by the guest's ready line)."""
    learn = workdir / 'learn'
    (learn / 'base').mkdir(parents=True)
    base = learn / 'base' / images.base_file_name(IMAGE_ID)
    os.link(glance_raw, base)
    learned = learning.learn_boot_image(base, learn / 'work', boot_timeout=BOOT_TIMEOUT,
                                        console_log=learn / 'console.log')
    published = workdir / 'published-boot-image.yolo'
    shutil.copyfile(learned.boot_image, published)
    shutil.rmtree(learn)
    print('boot image learned in %.1f s (window ended by %s)'
          % (learned.boot_seconds, learned.ended_by), flush=True)
    return published


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rates', default='1000,100',
                        help='link rates to Glance, Mbit/s, comma-separated')
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--image', choices=('test', 'large'), default='test')
    parser.add_argument('--modes', default=','.join(MODES),
                        help='the boots of each round, comma-separated (default: all three)')
    parser.add_argument('--workdir', default='/var/tmp')
    args = parser.parse_args()
    rates = [int(rate) for rate in args.rates.split(',')]
    modes = [mode for mode in MODES if mode in args.modes.split(',')]
    if not modes or set(args.modes.split(',')) - set(MODES):
        parser.error('--modes: a comma-separated list of %s' % ', '.join(MODES))
    test_image = subprocess.run([str(REPO / 'tools' / 'build-test-image.sh')], check=True,
                                capture_output=True, text=True).stdout.strip().splitlines()[-1]
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix='first-boot-bench.') as tmp, \
            contextlib.ExitStack() as scope:
        workdir = pathlib.Path(tmp)
        scope.enter_context(fixtures.Fixture()).useFixture(nova_fixtures.PrivsepFixture())
        glance_raw, digest = make_glance_data(workdir, test_image, args.image == 'large')
        published = learn_boot_image(workdir, glance_raw)
        host = Host(workdir, scope)
        server = scope.enter_context(ImageServer({IMAGE_ID: glance_raw,
                                                  BOOT_IMAGE_ID: published}))
        glance = EmulatedGlance(server, os.path.getsize(glance_raw), digest,
                                os.path.getsize(published))
        # Nova's own download (fetch_to_raw) goes through its module's image API.
        scope.enter_context(fixtures.Fixture()).useFixture(
            fixtures.MockPatch('nova.virt.images.IMAGE_API', glance))
        scope.enter_context(fixtures.Fixture()).useFixture(fixtures.MockPatch(
            'yolo_nova.virt.first_boot.GlanceData.for_context',
            lambda context, image_id: glance.data(image_id)))
        print('image: %s, %.2f GiB raw, %.1f MiB of data; boot image %.1f MiB'
              % (args.image, os.path.getsize(glance_raw) / GiB,
                 os.stat(glance_raw).st_blocks * 512 / (1 << 20),
                 os.path.getsize(published) / (1 << 20)), flush=True)
        results = {}
        for rate in rates:
            for round_ in range(args.rounds):
                order = modes[round_ % len(modes):] + modes[:round_ % len(modes)]
                for mode in order:
                    server.rate = 0
                    if mode == 'cached':
                        host.cache_image(glance_raw, published)
                    else:
                        host.forget_image()
                    drvr = host.driver(glance, mode)
                    server.rate = rate * 1e6 / 8
                    ready, created = host.boot(drvr, workdir / ('%s-%d-%d.log'
                                                                % (mode, rate, round_)))
                    # The fill of a YOLO first boot goes on after the guest is ready.
                    fill = drvr.yolo_first_boots and drvr.yolo_first_boots.running(host.name)
                    on_demand = ''
                    if fill:
                        on_demand = ('; %d ranges, %.1f MiB fetched on demand in %.1f s by then'
                                     % (fill.fetched_ranges, fill.fetched_bytes / (1 << 20),
                                        fill.fetch_seconds))
                        fill.wait()
                        assert fill.outcome == 'complete', fill.reason
                    results.setdefault((rate, mode), []).append(ready)
                    print('%5d Mbit/s round %d %-6s ready after %6.1f s (disk made in %5.1f s)%s%s'
                          % (rate, round_, mode, ready, created,
                             ', its base file still being filled' if fill else '', on_demand),
                          flush=True)
        if modes == list(MODES):
            print()
            print(first_boots.summary(results))


if __name__ == '__main__':
    main()
