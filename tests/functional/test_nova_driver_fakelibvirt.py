"""YoloLibvirtDriver on Nova's own test fixtures (fake libvirt, NoDBTestCase), with real files.

Disks, base files and boot images are real (``qemu-img``, ``yolofs build``/``verify``); what is
faked: libvirt (Nova's fakelibvirt), Glance (a small in-memory image API), and yolofs' mount and
control socket (whether yolofs is mounted is set, the "mount" is a plain directory holding the
base files while yolofs is "up" and empty while it is "down", and :class:`FakeYolofs` answers the
requests, checking installs with the real ``yolofs verify``). tests/functional/test_nova_driver.py
and tests/functional/test_boot_image_install.py do the same with a real mount.

Functional, not unit: Nova's privileged helpers run in-process as root, and the disks need
``qemu-img`` and the yolofs binary. tests/unit/virt/test_driver_without_disks.py holds what needs
none of them.
"""

import json
import os
import pathlib
import shutil
import stat
import subprocess
import threading
import time
from unittest import mock

from nova.compute import power_state
from nova import context as nova_context
from nova import exception
from nova import objects
from nova.tests import fixtures as nova_fixtures
from nova.tests.unit import fake_instance
from nova.virt import driver as virt_driver
from nova.virt import fake as fake_virt
from nova.virt.libvirt import driver as libvirt_driver
from nova.virt.libvirt import utils as libvirt_utils

from tests.unit import nova_base
from yolo_common import images
from yolo_common import yolofs
from yolo_nova.model import calibration
from yolo_nova.model import host_stats
from yolo_nova.model import locality
from yolo_nova.virt import backing
from yolo_nova.virt import boot_images
from yolo_nova.virt import detach
from yolo_nova.virt import driver as yolo_driver
from yolo_nova.virt import first_boot
from yolo_nova.virt import host_report
from yolo_nova.virt import nova_patches

IMAGE_ID = 'c0ffee00-0000-4000-8000-000000000001'
BOOT_IMAGE_ID = 'b0070000-0000-4000-8000-000000000002'
OTHER_IMAGE_ID = '0b5d7c1e-8d5e-4a55-9a57-2f5cbd1c3d3e'
MiB = 1024 * 1024


def downloads_left(directory):
    """What is in nova's download directory ``directory`` beside its record of what is
    installed."""
    return [name for name in os.listdir(directory) if name != boot_images.INSTALLED_RECORD]


class FakeImageAPI:
    """Glance as the driver sees it, with the user's and with the service identity: image
    properties and downloads. Images belong to the boot image publisher's project unless their
    record says otherwise."""

    project_id = 'yolo-service'

    def __init__(self):
        self.images = {}
        self.downloads = []
        # Set: downloads wait for it.
        self.gate = None

    def get(self, context, image_id):
        if image_id not in self.images:
            raise exception.ImageNotFound(image_id=image_id)
        record = self.images[image_id]
        return {'id': image_id, 'owner': record.get('owner', self.project_id),
                'container_format': record.get('container_format', 'yolo'),
                'status': 'active', 'size': record.get('size', 0),
                'disk_format': record.get('disk_format'),
                'os_hash_algo': record.get('os_hash_algo'),
                'os_hash_value': record.get('os_hash_value'),
                'properties': record['properties']}

    def download(self, context, image_id, dest_path=None):
        if self.gate is not None:
            assert self.gate.wait(30)
        self.downloads.append(image_id)
        shutil.copyfile(self.images[image_id]['file'], dest_path)

    def reject(self, context, image_id, reason):
        self.images[image_id]['properties']['yolo_boot_image_rejected'] = reason


class FakeYolofs:
    """yolofs' control socket as the driver uses it. An install is checked as yolofs checks it:
    a regular file, verified against the base file with the real ``yolofs verify``."""

    path = 'control.sock'

    def __init__(self, base_dir):
        self.base_dir = pathlib.Path(base_dir)
        self.entries = {}      # status' boot_images, by base file name
        self.remembered = {}   # base file name -> image id
        self.installs = []
        self.preload = mock.Mock()
        self.host_load = mock.Mock()
        self.touch = mock.Mock(side_effect=lambda file: os.utime(self.base_dir / file))
        self.install_error = None

    def load(self, **fields):
        """The host load the next host_load answers (yolofs.HostLoad's fields)."""
        self.host_load.return_value = yolofs.HostLoad(**fields)

    def status(self):
        return yolofs.Status.from_answer({
            'boot_images': [dict(e) for e in self.entries.values()],
            'rejected': [{'name': e['file'], 'reason': e['rejected']}
                         for e in self.entries.values() if e['rejected']]})

    def remember(self, file, image_id):
        if not (self.base_dir / file).is_file():
            raise yolofs.YolofsError('remember: base file %s: No such file or directory' % file)
        self.remembered[file] = image_id
        return {'file': file, 'image_id': image_id, 'changed': True}

    def install(self, file, boot_image_path, image_id, timeout=None):
        st = os.lstat(boot_image_path)
        self.installs.append({'file': file, 'path': boot_image_path, 'image_id': image_id,
                              'mode': stat.S_IMODE(st.st_mode), 'timeout': timeout})
        if self.install_error:
            raise self.install_error
        assert stat.S_ISREG(st.st_mode), boot_image_path
        proc = yolofs.run('verify', boot_image_path, self.base_dir / file, check=False)
        if proc.returncode != 0:
            raise yolofs.YolofsError('install: boot image %s does not match base file %s: %s'
                                     % (boot_image_path, file, proc.stderr.strip()),
                                     refused=True)
        self.entries[file] = {'file': file, 'image_id': image_id, 'verified': True,
                              'rejected': None, 'learned': False}
        return yolofs.Installed(file=file, image_id=image_id, extents=1,
                                bytes=os.path.getsize(boot_image_path), seconds=0.0)

    def prune(self):
        gone = sorted(n for n in self.entries if not (self.base_dir / n).exists())
        for name in gone:
            del self.entries[name]
        return [name + '.yolo' for name in gone]


def write_raw_base(path, size=8 * MiB, seed=1):
    """A raw 'image': distinct bytes in every 4 KiB block, so any mismatch is seen."""
    with open(path, 'wb') as f:
        for block in range(size // 4096):
            f.write(('%d:%d;' % (seed, block)).encode().ljust(4096, b'.'))


def build_boot_image(base, output, reads=((0, 65536), (MiB, 8192))):
    trace = pathlib.Path(str(output) + '.trace-in')
    trace.write_text(''.join('%d %d\n' % r for r in reads))
    yolofs.run('build', '--trace', trace, '--source', base, '--output', output,
               '--image-id', IMAGE_ID)
    trace.unlink()


class DriverTestCase(nova_base.NoDBTestCase):

    def setUp(self):
        super().setUp()
        self.libvirt = self.useFixture(nova_fixtures.LibvirtFixture())
        # Privileged helpers (utime, chown) run in-process: these tests run as root.
        self.useFixture(nova_fixtures.PrivsepFixture())
        self.root = pathlib.Path(self.useFixture(nova_fixtures.fixtures.TempDir()).path)
        self.instances = self.root / 'instances'
        self.base_dir = self.instances / '_base'
        self.mount = self.root / 'yolofs'
        self.downloads = self.root / 'downloads'
        for d in (self.base_dir, self.mount):
            d.mkdir(parents=True)
        self.flags(instances_path=str(self.instances), use_cow_images=True,
                   force_raw_images=True)
        self.flags(images_type='qcow2', virt_type='qemu', group='libvirt')
        self.flags(mount_point=str(self.mount), download_dir=str(self.downloads),
                   control_socket=str(self.root / 'control.sock'),
                   calibration_file=str(self.root / 'calibration.json'),
                   observed_boots_file=str(self.root / 'observed-boots.json'),
                   transfers_file=str(self.root / 'transfers.json'),
                   # Nova's own download: TestFailedFirstBoot and test_first_boot.py cover the
                   # first boot before it.
                   first_boot_before_download=False, group='yolo')
        self.drvr = virt_driver.load_compute_driver(fake_virt.FakeVirtAPI(),
                                                    'yolo.YoloLibvirtDriver')
        self.glance = FakeImageAPI()
        self.glance.images[IMAGE_ID] = {'properties': {}}
        self.drvr.yolo_boot_images._image_api = self.glance
        self.drvr.yolo_boot_images._boot_image_api = self.glance
        self.client = FakeYolofs(self.base_dir)
        self.drvr.yolo_backing.client = self.client
        self.context = nova_context.get_admin_context()
        self.instance = fake_instance.fake_instance_obj(
            self.context, uuid='4a7e6c02-0000-4000-8000-000000000003', image_ref=IMAGE_ID,
            flavor=objects.Flavor(root_gb=1, ephemeral_gb=0, swap=0, extra_specs={}))
        self.instance.system_metadata = {}
        self.instance.numa_topology = None
        self.instance.trusted_certs = None
        self.instance_dir = self.instances / self.instance.uuid
        self.name = images.base_file_name(IMAGE_ID)
        self.base = self.base_dir / self.name
        self.yolofs_up()

    # yolofs "up": mounted and answering, so the mirror holds the base files.
    def yolofs_up(self):
        self.healthy = True
        for base in self.base_dir.iterdir():
            if not (self.mount / base.name).exists():
                os.link(base, self.mount / base.name)
        self.useFixture(nova_fixtures.fixtures.MockPatchObject(
            backing.BackingFiles, 'mounted', lambda _: self.healthy))

    def yolofs_down(self):
        self.healthy = False
        for entry in self.mount.iterdir():
            entry.unlink()

    def fetch_image(self, target, **kwargs):
        write_raw_base(target)
        if self.healthy:
            os.link(target, self.mount / os.path.basename(target))

    def create_root_disk(self, name='disk', filename=None, image_id=IMAGE_ID):
        disk = self.drvr.image_backend.by_name(self.instance, name)
        disk.cache(fetch_func=self.fetch_image, context=self.context,
                   filename=filename or self.name, image_id=image_id, size=1024 * MiB)
        return disk

    def cache_base(self):
        """The base file in _base already, as Nova left it after an earlier download."""
        write_raw_base(self.base)
        self.yolofs_up()

    def create_first_root_disk(self):
        """The first root disk over the base file, which Nova downloads: the disk is made on
        _base, then the boot image is fetched; returns once it is."""
        self.glance.gate = threading.Event()
        disk = self.create_root_disk()
        self.assertEqual(str(self.base), self.backing_of(disk.path))
        self.glance.gate.set()
        self.wait_for_boot_image_fetch()
        return disk

    def wait_for_boot_image_fetch(self):
        fetch = self.drvr.yolo_boot_images.fetching(self.name)
        if fetch is not None:
            fetch.join(30)
            self.assertFalse(fetch.is_alive())

    def backing_of(self, disk_path):
        return backing.backing_info(str(disk_path))[0]

    def publish_boot_image(self, source=None):
        """Publishes a boot image of ``source`` (default: this image's own bytes) in Glance."""
        published = self.root / 'published.yolo'
        if source is None:
            source = self.root / 'glance-image.raw'
            write_raw_base(source)
        build_boot_image(source, published)
        self.glance.images[BOOT_IMAGE_ID] = {
            'properties': {'yolo_source_image_id': IMAGE_ID}, 'file': published}
        self.glance.images[IMAGE_ID] = {
            'properties': {'yolo_boot_image_id': BOOT_IMAGE_ID}, 'file': None}

    def domain_xml(self, *disks):
        devices = ''.join(
            "<disk type='file' device='disk'><driver name='qemu' type='qcow2'/>"
            "<source file='%s'/><target dev='vd%s' bus='virtio'/></disk>" % (d, 'abcd'[i])
            for i, d in enumerate(disks))
        return ("<domain type='qemu'><name>instance-1</name><uuid>%s</uuid><memory>131072"
                "</memory><vcpu>1</vcpu><os><type arch='x86_64'>hvm</type></os><devices>%s"
                "</devices></domain>" % (self.instance.uuid, devices))


class TestRootDiskCreation(DriverTestCase):

    def test_new_root_disk_is_backed_by_the_mount(self):
        disk = self.create_root_disk()
        self.assertEqual(str(self.mount / self.name), self.backing_of(disk.path))
        info = json.loads(subprocess.check_output(
            ['qemu-img', 'info', '--output=json', disk.path]))
        self.assertEqual('raw', info['backing-filename-format'])
        self.assertEqual(1024 * MiB, info['virtual-size'])

    def test_yolofs_down_keeps_the_base_backing_file(self):
        self.yolofs_down()
        disk = self.create_root_disk()
        self.assertEqual(str(self.base), self.backing_of(disk.path))

    def test_disabled_keeps_the_base_backing_file(self):
        self.drvr.yolo_backing.enabled = False
        disk = self.create_root_disk()
        self.assertEqual(str(self.base), self.backing_of(disk.path))

    def test_a_cached_base_file_is_marked_in_use_through_yolofs(self):
        self.create_root_disk()
        os.utime(self.base, (1000, 1000))
        self.create_root_disk(name='disk.rescue')
        # At each disk Nova creates over it, the first (just downloaded) included.
        self.assertEqual([mock.call(self.name)] * 2, self.client.touch.call_args_list)
        self.assertGreater(os.stat(self.base).st_mtime, 1000)

    def test_nova_marks_it_itself_when_yolofs_cannot(self):
        self.create_root_disk()
        os.utime(self.base, (1000, 1000))
        self.client.touch.side_effect = yolofs.YolofsError('touch: no')
        self.create_root_disk(name='disk.rescue')
        self.assertGreater(os.stat(self.base).st_mtime, 1000)

    def test_ephemeral_and_swap_disks_stay_on_base(self):
        for name, filename in (('disk.local', 'ephemeral_1_0706d66'), ('disk.swap', 'swap_512')):
            disk = self.drvr.image_backend.by_name(self.instance, name)
            disk.cache(fetch_func=self.fetch_image, filename=filename, size=1024 * MiB,
                       safe=True)
            self.assertEqual(str(self.base_dir / filename), self.backing_of(disk.path))

    def test_published_boot_image_is_handed_to_yolofs_and_installed(self):
        self.publish_boot_image()
        self.create_first_root_disk()
        self.assertEqual([BOOT_IMAGE_ID], self.glance.downloads)
        [install] = self.client.installs
        self.assertEqual((self.name, IMAGE_ID), (install['file'], install['image_id']))
        # Downloaded into nova's own directory, readable by yolofs, deleted once installed.
        self.assertEqual(str(self.downloads), os.path.dirname(install['path']))
        self.assertEqual(0o644, install['mode'])
        self.assertEqual(120.0, install['timeout'])
        self.assertEqual([], downloads_left(self.downloads))
        self.assertEqual({self.name: IMAGE_ID}, self.client.remembered)
        self.assertEqual({IMAGE_ID}, self.drvr.yolo_boot_images.verified_image_ids())
        # Already there: a second disk of the same image does not download it again.
        rescue = self.create_root_disk(name='disk.rescue')
        self.assertEqual([BOOT_IMAGE_ID], self.glance.downloads)
        self.assertEqual(1, len(self.client.installs))
        self.assertEqual(str(self.mount / self.name), self.backing_of(rescue.path))

    def test_a_cached_base_files_boot_image_is_installed_before_the_disk_is_made(self):
        # The boot reads the base file from the disk: served from memory, it is faster.
        write_raw_base(self.base)
        self.yolofs_up()
        self.publish_boot_image()
        disk = self.create_root_disk()
        self.assertIsNone(self.drvr.yolo_boot_images.fetching(self.name))
        self.assertEqual(1, len(self.client.installs))
        self.assertEqual(str(self.mount / self.name), self.backing_of(disk.path))

    def test_guests_started_while_the_boot_image_is_fetched_start_on_base(self):
        # As Nova's would: the boot's bytes are in the page cache, and a learning yolofs would
        # record a boot its boot image already holds.
        self.publish_boot_image()
        self.glance.gate = threading.Event()
        disk = self.create_root_disk()
        # Later disks of the image, made meanwhile, wait for nothing and download nothing.
        for later in (True, False):
            self.assertEqual('fetching', self.drvr.yolo_boot_images.ensure(
                self.context, IMAGE_ID, str(self.base), later=later))
        self.assertEqual([], self.glance.downloads)
        created = self.useFixture(nova_fixtures.fixtures.MockPatchObject(
            libvirt_driver.LibvirtDriver, '_create_guest')).mock
        self.drvr._create_guest(self.context, self.domain_xml(disk.path), self.instance)
        created.assert_called_once()
        self.assertEqual(str(self.base), self.backing_of(disk.path))
        self.client.preload.assert_not_called()
        self.glance.gate.set()
        self.wait_for_boot_image_fetch()
        # One fetch for both.
        self.assertEqual([BOOT_IMAGE_ID], self.glance.downloads)
        self.drvr._create_guest(self.context, self.domain_xml(disk.path), self.instance)
        self.assertEqual(str(self.mount / self.name), self.backing_of(disk.path))
        self.client.preload.assert_called_once_with(self.name)

    def test_downloads_an_earlier_nova_compute_left_are_deleted(self):
        self.downloads.mkdir()
        (self.downloads / (self.name + '.a1b2.yolo')).write_bytes(b'half a boot image')
        (self.downloads / 'not-ours').write_bytes(b'')
        self.drvr.yolo_boot_images.remove_leftover_downloads()
        self.assertEqual(['not-ours'], downloads_left(self.downloads))

    def test_download_dir_defaults_to_the_instances_path(self):
        self.flags(download_dir=None, group='yolo')
        drvr = virt_driver.load_compute_driver(fake_virt.FakeVirtAPI(), 'yolo.YoloLibvirtDriver')
        self.assertEqual(str(self.instances / 'yolo-incoming'),
                         drvr.yolo_boot_images.download_dir)

    def test_mismatching_boot_image_is_not_installed_and_the_disk_is_created(self):
        other = self.root / 'other.raw'
        write_raw_base(other, seed=2)
        self.publish_boot_image(source=other)
        self.create_first_root_disk()
        self.assertEqual(1, len(self.client.installs))
        self.assertEqual({}, self.client.entries)
        self.assertEqual([], downloads_left(self.downloads))
        self.assertEqual('rejected', self.drvr.yolo_boot_images.ensure(
            self.context, IMAGE_ID, str(self.base)))
        # Refused once on this host: not downloaded again at every spawn.
        self.assertEqual([BOOT_IMAGE_ID], self.glance.downloads)
        self.assertEqual(1, len(self.client.installs))

    def assert_untrusted_boot_image_is_never_downloaded(self, **boot_image_fields):
        self.publish_boot_image()
        self.glance.images[BOOT_IMAGE_ID].update(boot_image_fields)
        disk = self.create_root_disk()
        self.assertEqual('rejected', self.drvr.yolo_boot_images.ensure(
            self.context, IMAGE_ID, str(self.base)))
        self.assertEqual([], self.glance.downloads)
        self.assertEqual([], self.client.installs)
        self.assertEqual(str(self.mount / self.name), self.backing_of(disk.path))

    def test_boot_image_of_another_project_is_never_downloaded(self):
        # A tenant's decoy: a hidden image of its own, linked from its own source image.
        self.assert_untrusted_boot_image_is_never_downloaded(owner='tenant-project')

    def test_boot_image_of_another_format_is_never_downloaded(self):
        self.assert_untrusted_boot_image_is_never_downloaded(container_format='bare')

    def test_boot_image_built_for_another_image_is_never_downloaded(self):
        self.assert_untrusted_boot_image_is_never_downloaded(
            properties={'yolo_source_image_id': 'some-other-image'})

    def test_boot_image_over_the_size_limit_is_never_downloaded(self):
        self.flags(max_boot_image_bytes=1 << 20, group='yolo')
        self.drvr = virt_driver.load_compute_driver(fake_virt.FakeVirtAPI(),
                                                    'yolo.YoloLibvirtDriver')
        self.drvr.yolo_boot_images._image_api = self.glance
        self.drvr.yolo_boot_images._boot_image_api = self.glance
        self.drvr.yolo_backing.client = self.client
        self.assert_untrusted_boot_image_is_never_downloaded(size=(1 << 20) + 1)

    def test_yolofs_failing_mid_install_does_not_fail_the_disk(self):
        self.publish_boot_image()
        self.client.install_error = ConnectionResetError('yolofs went away')
        self.create_first_root_disk()
        self.assertEqual([], downloads_left(self.downloads))
        # A failed fetch holds no disk on _base.
        self.assertIsNone(self.drvr.yolo_boot_images.fetching(self.name))
        rescue = self.create_root_disk(name='disk.rescue')
        self.assertEqual(str(self.mount / self.name), self.backing_of(rescue.path))
        self.assertEqual('failed', self.drvr.yolo_boot_images.ensure(
            self.context, IMAGE_ID, str(self.base)))

    def test_store_failure_is_not_remembered_as_a_refusal(self):
        # yolofs could not write its store (a full disk): the boot image itself may be good.
        self.publish_boot_image()
        self.client.install_error = yolofs.YolofsError(
            'install: installing into the store /var/lib/yolo: No space left on device')
        self.create_first_root_disk()
        self.assertEqual('failed', self.drvr.yolo_boot_images.ensure(
            self.context, IMAGE_ID, str(self.base)))
        self.client.install_error = None
        self.assertEqual('installed', self.drvr.yolo_boot_images.ensure(
            self.context, IMAGE_ID, str(self.base)))
        self.assertEqual([BOOT_IMAGE_ID] * 3, self.glance.downloads)

    def test_glance_failure_does_not_fail_the_disk(self):
        self.glance.images[IMAGE_ID] = {'properties': {'yolo_boot_image_id': 'gone'}}
        disk = self.create_root_disk()
        self.assertEqual([], self.client.installs)
        self.assertEqual(str(self.mount / self.name), self.backing_of(disk.path))

    def test_image_without_boot_image_is_left_to_learning(self):
        self.glance.images[IMAGE_ID] = {'properties': {}}
        write_raw_base(self.base)
        self.assertEqual('none', self.drvr.yolo_boot_images.ensure(
            self.context, IMAGE_ID, str(self.base)))
        # yolofs knows the image of the base file: the boot image it learns names it.
        self.assertEqual({self.name: IMAGE_ID}, self.client.remembered)

    def test_yolofs_down_means_nothing_is_attempted(self):
        self.publish_boot_image()
        self.yolofs_down()
        disk = self.create_root_disk()
        self.assertEqual(str(self.base), self.backing_of(disk.path))
        self.assertEqual([], self.glance.downloads)
        self.assertEqual(({}, []), (self.client.remembered, self.client.installs))
        self.assertEqual('unavailable', self.drvr.yolo_boot_images.ensure(
            self.context, IMAGE_ID, str(self.base)))


class TestGuestStart(DriverTestCase):
    """Every start goes through _create_guest: the backing file follows yolofs' health."""

    def setUp(self):
        super().setUp()
        self.disk = self.create_root_disk()
        self.created = self.useFixture(nova_fixtures.fixtures.MockPatchObject(
            libvirt_driver.LibvirtDriver, '_create_guest')).mock

    def start(self, **kwargs):
        self.drvr._create_guest(self.context, self.domain_xml(self.disk.path), self.instance,
                                **kwargs)
        self.created.assert_called()

    def test_start_with_yolofs_down_rebases_back_to_base(self):
        self.yolofs_down()
        self.start()
        self.assertEqual(str(self.base), self.backing_of(self.disk.path))
        self.client.preload.assert_not_called()

    def test_start_with_yolofs_back_rebases_onto_the_mount_and_preloads(self):
        self.publish_boot_image()
        self.drvr.yolo_boot_images.ensure(self.context, IMAGE_ID, str(self.base))
        self.yolofs_down()
        self.start()
        self.yolofs_up()
        self.start()
        self.assertEqual(str(self.mount / self.name), self.backing_of(self.disk.path))
        self.client.preload.assert_called_once_with(self.name)

    def test_no_preload_when_yolofs_has_no_boot_image(self):
        self.start()
        self.assertEqual(str(self.mount / self.name), self.backing_of(self.disk.path))
        self.client.preload.assert_not_called()

    def test_no_preload_over_a_base_file_being_filled(self):
        # The fill serves it from its own boot image: a preload would only make yolofs say
        # that the fill file keeps changing.
        self.publish_boot_image()
        self.drvr.yolo_boot_images.ensure(self.context, IMAGE_ID, str(self.base))
        self.drvr.yolo_first_boots = mock.Mock(
            running=lambda name: mock.Mock() if name == self.name else None)
        self.start()
        self.assertEqual(str(self.mount / self.name), self.backing_of(self.disk.path))
        self.client.preload.assert_not_called()

    def test_preload_failure_does_not_stop_the_start(self):
        self.publish_boot_image()
        self.drvr.yolo_boot_images.ensure(self.context, IMAGE_ID, str(self.base))
        self.client.preload.side_effect = yolofs.YolofsError('preload: no')
        self.start()
        self.assertEqual(str(self.mount / self.name), self.backing_of(self.disk.path))

    def test_rescue_start_places_every_disk(self):
        rescue = self.create_root_disk(name='disk.rescue')
        self.yolofs_down()
        self.drvr._create_guest(self.context, self.domain_xml(rescue.path, self.disk.path),
                                self.instance)
        for disk in (rescue, self.disk):
            self.assertEqual(str(self.base), self.backing_of(disk.path))

    def test_unrescue_with_yolofs_down_defines_no_chain_on_the_mount(self):
        # rescue saved the live XML, whose backingStore names the mount; unrescue defines it again.
        live = self.domain_xml(self.disk.path).replace(
            "<target dev='vda'",
            "<backingStore type='file'><format type='raw'/><source file='%s'/><backingStore/>"
            "</backingStore><target dev='vda'" % (self.mount / self.name))
        self.yolofs_down()
        self.drvr._create_guest(self.context, live, self.instance)
        defined = self.created.call_args.args[1]
        self.assertNotIn(str(self.mount), defined)
        self.assertIn("<source file='%s'/>" % self.disk.path, defined.replace('"', "'"))
        self.assertEqual(str(self.base), self.backing_of(self.disk.path))

    def test_defining_without_starting_changes_nothing(self):
        self.yolofs_down()
        self.start(power_on=False)
        self.assertEqual(str(self.mount / self.name), self.backing_of(self.disk.path))

    def test_resize_with_yolofs_down_works(self):
        # qemu-img resize opens the backing chain: it must be openable.
        self.yolofs_down()
        self.disk.resize_image(2048 * MiB)
        self.assertEqual(str(self.base), self.backing_of(self.disk.path))
        info = json.loads(subprocess.check_output(
            ['qemu-img', 'info', '--output=json', self.disk.path]))
        self.assertEqual(2048 * MiB, info['virtual-size'])

    def test_resize_runs_on_base_and_leaves_the_disk_on_the_mount(self):
        with mock.patch('nova.virt.disk.api.extend') as extend:
            extend.side_effect = lambda image, size: self.assertEqual(
                str(self.base), self.backing_of(image.path))
            self.disk.resize_image(2048 * MiB)
        extend.assert_called_once()
        self.assertEqual(str(self.mount / self.name), self.backing_of(self.disk.path))

    def test_live_snapshot_with_yolofs_down_reads_base(self):
        # The disk stays on the mount while its guest runs; yolofs then goes down.
        self.yolofs_down()
        out = self.root / 'live-snapshot.raw'
        guest = mock.Mock()
        guest.get_block_device.return_value.is_job_complete.return_value = True
        guest.has_persistent_configuration.return_value = False
        with mock.patch.object(self.drvr, '_can_quiesce'), \
                mock.patch.object(self.drvr, 'quiesce',
                                  side_effect=exception.InstanceQuiesceNotSupported(
                                      instance_id='i', reason='test')), \
                mock.patch.object(self.drvr._host, 'write_instance_config'), \
                mock.patch('nova.virt.libvirt.utils.extract_snapshot',
                           wraps=libvirt_utils.extract_snapshot) as extract:
            self.drvr._live_snapshot(self.context, self.instance, guest, self.disk.path,
                                     str(out), 'qcow2', 'raw', objects.ImageMeta())
        delta = extract.call_args.args[0]
        self.assertTrue(delta.endswith('.delta'))
        # The delta the guest's disk was copied into is backed by _base, not by the mount.
        copy = guest.get_block_device.return_value.rebase
        copy.assert_called_once_with(delta, copy=True, reuse_ext=True, shallow=True)
        with open(out, 'rb') as snap, open(self.base, 'rb') as base:
            self.assertEqual(base.read(8 * MiB), snap.read(8 * MiB))
        # Basenames, which every other caller asks for, are the header's.
        self.assertEqual(self.name, libvirt_utils.get_disk_backing_file(self.disk.path))

    def test_cold_snapshot_with_yolofs_down_works(self):
        self.yolofs_down()
        target = self.root / 'snapshot.raw'
        self.disk.snapshot_extract(str(target), 'raw')
        with open(target, 'rb') as snap, open(self.base, 'rb') as base:
            self.assertEqual(base.read(8 * MiB), snap.read(8 * MiB))


class TestPowerOn(DriverTestCase):

    def test_power_on_with_yolofs_down_starts_from_base(self):
        # power_on -> _hard_reboot -> _create_guest_with_network -> _create_guest -> fake
        # libvirt, through Nova's real code; only the XML generation and teardown are stubbed.
        disk = self.create_root_disk()
        self.yolofs_down()
        xml = self.domain_xml(disk.path)
        with mock.patch.object(self.drvr, '_get_guest_xml', return_value=xml), \
                mock.patch.object(self.drvr, 'destroy'), \
                mock.patch.object(self.drvr, '_get_existing_guest_config',
                                  return_value=None), \
                mock.patch.object(self.drvr, '_get_all_assigned_mediated_devices',
                                  return_value={}), \
                mock.patch.object(self.drvr, '_create_images_and_backing'), \
                mock.patch.object(self.drvr, '_build_device_metadata', return_value=None), \
                mock.patch('nova.virt.libvirt.blockinfo.get_disk_info', return_value={}):
            self.drvr.power_on(self.context, self.instance, network_info=[])
        self.assertEqual(power_state.RUNNING, self.drvr.get_info(self.instance).state)
        self.assertEqual(str(self.base), self.backing_of(disk.path))

    def test_soft_reboot_with_yolofs_down_falls_back_to_hard_reboot(self):
        disk = self.create_root_disk()
        self.yolofs_down()
        with mock.patch.object(libvirt_driver.LibvirtDriver, '_soft_reboot') as soft, \
                mock.patch.object(self.drvr, '_hard_reboot') as hard:
            self.drvr.reboot(self.context, self.instance, [], 'SOFT')
        soft.assert_not_called()
        hard.assert_called_once()
        self.assertEqual(str(self.mount / self.name), self.backing_of(disk.path))

    def test_soft_reboot_with_yolofs_up_is_nova_s(self):
        self.create_root_disk()
        with mock.patch.object(libvirt_driver.LibvirtDriver, '_soft_reboot',
                               return_value=True) as soft, \
                mock.patch.object(self.drvr, '_hard_reboot') as hard:
            self.drvr.reboot(self.context, self.instance, [], 'SOFT')
        soft.assert_called_once()
        hard.assert_not_called()


class TestMoves(DriverTestCase):

    def unshelve(self, healthy):
        snapshot_base = self.base_dir / images.base_file_name('snapshot')
        write_raw_base(snapshot_base)
        os.link(snapshot_base, self.mount / snapshot_base.name)
        disk = self.create_root_disk(filename=snapshot_base.name, image_id='snapshot')
        if not healthy:
            self.yolofs_down()
        self.instance.system_metadata = {'image_base_image_ref': IMAGE_ID}
        self.instance.vm_state = 'shelved_offloaded'
        # Nova's safe rebase reads the disk's backing file: it must be _base's, whatever the
        # nested image creation (Nova's cache() of the original image, through our backend) did.
        rebase = libvirt_driver.LibvirtDriver._rebase_with_qemu_img
        seen = []

        def safe_rebase(path, backing):
            seen.append(self.backing_of(path))
            return rebase(path, backing)

        with mock.patch('nova.virt.libvirt.utils.fetch_image', side_effect=(
                lambda context, target, image_id, trusted_certs=None: self.fetch_image(target))), \
                mock.patch.object(libvirt_driver.LibvirtDriver, '_rebase_with_qemu_img',
                                  side_effect=safe_rebase), \
                mock.patch.object(self.drvr, '_needs_rebase_original_qcow2_image',
                                  return_value=True):
            self.drvr._rebase_original_qcow2_image(self.context, self.instance, disk)
        self.assertEqual([str(snapshot_base)], seen)
        return self.backing_of(disk.path)

    def test_unshelve_rebases_onto_the_original_image_then_the_mount(self):
        self.assertEqual(str(self.mount / self.name), self.unshelve(healthy=True))

    def test_unshelve_with_yolofs_down_stays_on_base(self):
        self.assertEqual(str(self.base), self.unshelve(healthy=False))

    def test_a_new_guests_disk_stays_on_the_mount_through_the_rebase_nova_skips(self):
        # Nova calls it at every spawn; a disk over a base file being filled must not wait
        # there for the fill (the first boot before the download would wait for all of it).
        disk = self.create_root_disk()
        with mock.patch.object(self.drvr.yolo_backing, 'on_base') as on_base:
            self.drvr._rebase_original_qcow2_image(self.context, self.instance, disk)
        on_base.assert_not_called()
        self.assertEqual(str(self.mount / self.name), self.backing_of(disk.path))

    def test_a_destination_that_cannot_serve_the_shared_disk_is_refused_in_its_check(self):
        self.create_root_disk()
        self.yolofs_down()
        with mock.patch.object(libvirt_driver.LibvirtDriver,
                               'cleanup_live_migration_destination_check') as cleanup:
            with mock.patch.object(libvirt_driver.LibvirtDriver,
                                   'check_can_live_migrate_destination'):
                self.assertRaises(exception.MigrationPreCheckError,
                                  self.drvr.check_can_live_migrate_destination,
                                  self.context, self.instance, {}, {})
        cleanup.assert_called_once()   # the check's temporary file on the shared storage
        # YOLO disabled on the destination: no mount there either.
        self.yolofs_up()
        self.flags(enabled=False, group='yolo')
        self.drvr.yolo_backing.enabled = False
        with mock.patch.object(libvirt_driver.LibvirtDriver,
                               'check_can_live_migrate_destination'), \
                mock.patch.object(libvirt_driver.LibvirtDriver,
                                  'cleanup_live_migration_destination_check'):
            error = self.assertRaises(exception.MigrationPreCheckError,
                                      self.drvr.check_can_live_migrate_destination,
                                      self.context, self.instance, {}, {})
        self.assertIn('disabled', str(error))

    def test_a_destination_that_serves_or_does_not_share_the_disk_passes(self):
        with mock.patch.object(libvirt_driver.LibvirtDriver,
                               'check_can_live_migrate_destination', return_value='data'):
            # No disk here: not shared storage, the destination disk will be made here.
            self.yolofs_down()
            self.assertEqual('data', self.drvr.check_can_live_migrate_destination(
                self.context, self.instance, {}, {}))
            self.yolofs_up()
            self.create_root_disk()
            self.assertEqual('data', self.drvr.check_can_live_migrate_destination(
                self.context, self.instance, {}, {}))

    def test_the_migration_destination_xml_has_no_backing_store(self):
        from nova.virt.libvirt import migration as libvirt_migrate
        self.assertTrue(libvirt_migrate.get_updated_guest_xml.without_backing_stores)
        live = self.domain_xml('/i/disk').replace(
            "<target dev='vda'", "<backingStore type='file'><format type='raw'/><source "
            "file='%s'/></backingStore><target dev='vda'" % (self.mount / self.name))
        updated = nova_patches.returning_no_backing_stores(lambda *a, **k: live)(1, key=2)
        self.assertNotIn('backingStore', updated)
        self.assertIn("/i/disk", updated)
        # Installed once, however many drivers are made.
        virt_driver.load_compute_driver(fake_virt.FakeVirtAPI(), 'yolo.YoloLibvirtDriver')
        self.assertFalse(getattr(libvirt_migrate.get_updated_guest_xml.__wrapped__,
                                 'without_backing_stores', False))

    def test_live_migration_shared_path_refused_when_yolofs_down_here(self):
        self.create_root_disk()
        self.yolofs_down()
        migrate_data = objects.LibvirtLiveMigrateData(
            is_shared_instance_path=True, is_shared_block_storage=False, block_migration=False)
        self.assertRaises(exception.MigrationPreCheckError, self.drvr.pre_live_migration,
                          self.context, self.instance, None, [], None, migrate_data)

    def test_live_migration_shared_path_proceeds_when_yolofs_healthy(self):
        self.create_root_disk()
        migrate_data = objects.LibvirtLiveMigrateData(
            is_shared_instance_path=True, is_shared_block_storage=False, block_migration=False)
        with mock.patch.object(libvirt_driver.LibvirtDriver, 'pre_live_migration') as pre:
            self.drvr.pre_live_migration(self.context, self.instance, None, [], None,
                                         migrate_data)
        pre.assert_called_once()

    def block_migrate(self):
        # Nova's own _create_images_and_backing (live block migration, hard reboot) through the
        # yolo backend: the destination disk is created over the cached base file.
        disk_info = [{'type': 'qcow2', 'path': str(self.instance_dir / 'disk'),
                      'virt_disk_size': 1024 * MiB, 'backing_file': self.name,
                      'disk_size': 0, 'over_committed_disk_size': 0}]
        self.instance_dir.mkdir()
        with mock.patch('nova.virt.libvirt.utils.fetch_image', side_effect=(
                lambda context, target, image_id, trusted_certs=None: self.fetch_image(target))):
            self.drvr._create_images_and_backing(self.context, self.instance,
                                                 str(self.instance_dir), disk_info)
        return self.backing_of(self.instance_dir / 'disk')

    def test_block_migration_creates_the_destination_disk_on_the_mount(self):
        self.assertEqual(str(self.mount / self.name), self.block_migrate())

    def test_block_migration_to_a_host_with_yolofs_down_uses_base(self):
        self.yolofs_down()
        self.assertEqual(str(self.base), self.block_migrate())

    def guest_on(self, path, running=True):
        guest = mock.Mock()
        guest.is_active.return_value = running
        guest.get_xml_desc.return_value = self.domain_xml(path)
        return guest

    def test_a_guest_that_leaves_the_host_is_moved_back_from_its_interim_disk_first(self):
        # Nova carries the files the domain names, not the detach's mark.
        self.create_root_disk()
        interim = self.instance_dir / 'disk.yolo-detach'
        interim.write_bytes(b'the guest is here')
        with mock.patch.object(self.drvr, '_yolo_guest', return_value=self.guest_on(interim)), \
                mock.patch.object(self.drvr.yolo_detacher, 'detach') as detach_now, \
                mock.patch.object(libvirt_driver.LibvirtDriver,
                                  'migrate_disk_and_power_off') as nova_s:
            self.drvr.migrate_disk_and_power_off(self.context, self.instance, 'dest', None, [])
            detach_now.assert_called_once_with(self.instance.uuid)
            nova_s.assert_called_once()
            # Moved back it could not be: the move is refused, the instance left as it was.
            detach_now.reset_mock(), nova_s.reset_mock()
            detach_now.side_effect = detach.DetachFailed('libvirt did not answer')
            self.assertRaises(exception.InstanceFaultRollback,
                              self.drvr.migrate_disk_and_power_off, self.context,
                              self.instance, 'dest', None, [])
            nova_s.assert_not_called()

    def test_stopping_a_guest_is_never_held_up_by_what_a_detach_left(self):
        with mock.patch.object(self.drvr, '_yolo_guest', side_effect=RuntimeError('libvirt')), \
                mock.patch.object(libvirt_driver.LibvirtDriver, 'power_off') as nova_s:
            self.drvr.power_off(self.instance)
        nova_s.assert_called_once()

    def test_a_guest_that_arrived_on_the_mount_is_detached_at_once(self):
        # It did not start here, so nothing else would move it off this host's mount.
        self.block_migrate()
        guest = mock.Mock()
        guest.get_xml_desc.return_value = self.domain_xml(self.instance_dir / 'disk')
        with mock.patch.object(libvirt_driver.LibvirtDriver,
                               'post_live_migration_at_destination') as nova_s, \
                mock.patch.object(self.drvr, '_yolo_guest', return_value=guest), \
                mock.patch.object(self.drvr.yolo_detacher, 'watch') as watch:
            self.drvr.post_live_migration_at_destination(self.context, self.instance, [])
            nova_s.assert_called_once()
            watch.assert_called_once_with(self.instance.uuid, [self.name], at_once=True)
            # Arrived over _base (a destination whose yolofs is down): nothing to do.
            watch.reset_mock()
            backing.rebase_unsafe(str(self.instance_dir / 'disk'), str(self.base), 'raw')
            self.drvr.post_live_migration_at_destination(self.context, self.instance, [])
            watch.assert_not_called()


class TestImageCache(DriverTestCase):

    def test_base_file_in_use_through_the_mount_is_kept_unused_ones_go(self):
        self.cache_base()
        self.publish_boot_image()
        disk = self.create_root_disk()
        self.assertEqual(str(self.mount / self.name), self.backing_of(disk.path))
        unused = self.base_dir / images.base_file_name('unused-image')
        write_raw_base(unused, size=MiB)
        self.client.entries[unused.name] = {'file': unused.name, 'image_id': 'unused-image',
                                            'verified': True, 'rejected': None,
                                            'learned': False}
        old = time.time() - 10 * 86400
        for base in (self.base, unused):
            os.utime(base, (old, old))
        self.flags(remove_unused_base_images=True,
                   remove_unused_original_minimum_age_seconds=1, group='image_cache')
        self.instance.host = self.drvr._host.get_hostname()
        with mock.patch.object(objects.block_device.BlockDeviceMappingList,
                               'bdms_by_instance_uuid', return_value={}):
            self.drvr.manage_image_cache(self.context, [self.instance])
        self.assertTrue(self.base.exists())
        self.assertFalse(unused.exists())
        # yolofs was asked to prune its store: the boot image of the removed base file is gone.
        self.assertEqual([self.name], list(self.client.entries))


class TestHostStats(DriverTestCase):

    def resources(self, stats_keys):
        with mock.patch.object(libvirt_driver.LibvirtDriver, 'get_available_resource',
                               return_value={'vcpus': 2, 'stats': {'uptime': 'up'}}):
            data = self.drvr.get_available_resource('node')
        self.assertEqual('up', data['stats']['uptime'])
        for value in data['stats'].values():
            self.assertIsInstance(value, str)  # ComputeNode.stats holds strings
        return data['stats']

    def test_reports_load_parameters_and_verified_boot_images(self):
        self.cache_base()
        self.publish_boot_image()
        self.create_root_disk()
        self.client.load(io_utilisation=0.25, cpu_utilisation=0.5)
        stats = self.resources(host_stats.KEYS)
        self.assertEqual('true', stats['yolo_active'])
        state = host_stats.from_stats(stats, max_age=300)
        self.assertEqual(0.25, state.io_utilisation)
        self.assertEqual(0.5, state.cpu_utilisation)
        self.assertEqual(2, state.params.cpus)
        self.assertTrue(state.holds_boot_image(IMAGE_ID))
        self.assertTrue(state.holds_base_file(IMAGE_ID))
        self.assertFalse(state.holds_base_file(OTHER_IMAGE_ID))
        # The list is empty: the filter says what is held.
        self.assertEqual(frozenset(), state.boot_images)
        self.assertFalse(state.streams_first_boots)     # first_boot_before_download = False
        # The boot image installed: its size against the base file's.
        self.assertEqual(
            round(os.path.getsize(self.root / 'published.yolo') / os.path.getsize(self.base),
                  4), state.boot_image_ratio)

    def test_what_a_host_holds_omits_fills_downloads_ephemeral_and_swap(self):
        self.cache_base()
        for leftover in (self.name + '.yolo-fill', self.name + '.part', 'ephemeral_1_0706d66',
                         'swap_512'):
            (self.base_dir / leftover).write_bytes(b'')
        held = self.drvr.yolo_report.held(self.client.status())
        entries = {locality.base_file_entry(n) for n in (
            self.name, self.name + '.yolo-fill', self.name + '.part', 'ephemeral_1_0706d66',
            'swap_512')}
        self.assertEqual({locality.base_file_entry(self.name)},
                         {e for e in entries if e in held})

    def test_rejected_boot_images_are_not_reported(self):
        self.cache_base()
        self.publish_boot_image()
        self.create_root_disk()
        self.client.entries[self.name].update(verified=False, rejected='does not match')
        self.client.load(io_utilisation=0.0, cpu_utilisation=0.0)
        state = host_stats.from_stats(self.resources(host_stats.KEYS), max_age=300)
        self.assertFalse(state.holds_boot_image(IMAGE_ID))
        self.assertTrue(state.holds_base_file(IMAGE_ID))

    def test_rates_from_the_hosts_own_transfers_unless_set(self):
        self.client.load(io_utilisation=0.0, cpu_utilisation=0.0)
        state = host_stats.from_stats(self.resources(host_stats.KEYS), max_age=300)
        self.assertEqual((125e6, 200e6), (state.params.glance_bytes_per_second,
                                          state.params.convert_bytes_per_second))
        self.drvr.yolo_backing.transfers.record('download', 400 * MiB, 4.0)
        self.drvr.yolo_backing.transfers.record('conversion', 900 * MiB, 3.0)
        state = host_stats.from_stats(self.resources(host_stats.KEYS), max_age=300)
        self.assertEqual((100 * MiB, 300 * MiB), (state.params.glance_bytes_per_second,
                                                  state.params.convert_bytes_per_second))
        self.flags(glance_bytes_per_second=12.5e6, group='yolo')
        state = host_stats.from_stats(self.resources(host_stats.KEYS), max_age=300)
        self.assertEqual(12.5e6, state.params.glance_bytes_per_second)

    def test_calibration_file_gives_parameters_and_throughput_utilisation(self):
        calibration.save(calibration.Calibration(
            alpha=7.0, beta=20.0, alpha_yolo=0.5, cpus=2, disk_iops=300.0,
            disk_bytes_per_second=150e6, io_exponent=0.2), str(self.root / 'calibration.json'))
        self.client.load(io_utilisation=0.9, cpu_utilisation=0.1, iops=150.0,
                         bytes_per_second=15e6, runnable_per_cpu=0.75)
        state = host_stats.from_stats(self.resources(host_stats.KEYS), max_age=300)
        self.assertEqual((7.0, 20.0, 0.5, 0.2), (state.params.alpha, state.params.beta,
                                                 state.params.alpha_yolo,
                                                 state.params.io_exponent))
        self.assertEqual(0.5, state.io_utilisation)  # 150 of 300 IOPS, not 90 % busy
        self.assertEqual(0.75, state.runnable)

        # nova.conf wins over the file.
        self.flags(boot_time_beta=30.0, disk_iops=600.0, group='yolo')
        state = host_stats.from_stats(self.resources(host_stats.KEYS), max_age=300)
        self.assertEqual((7.0, 30.0), (state.params.alpha, state.params.beta))
        self.assertEqual(0.25, state.io_utilisation)

    def test_broken_calibration_file_falls_back_to_defaults(self):
        (self.root / 'calibration.json').write_text('{"alpha": "fast"}')
        self.client.load(io_utilisation=0.3, cpu_utilisation=0.1)
        state = host_stats.from_stats(self.resources(host_stats.KEYS), max_age=300)
        self.assertEqual(host_report.UNCALIBRATED.alpha, state.params.alpha)
        self.assertEqual(0.3, state.io_utilisation)

    def test_yolofs_down_reports_inactive_and_no_load(self):
        self.yolofs_down()
        stats = self.resources(())
        self.assertEqual('false', stats['yolo_active'])
        self.assertIsNone(host_stats.from_stats(stats, max_age=300))


class TestCacheImage(DriverTestCase):
    """Nova's caching of an image by request (API 2.81) brings its boot image too."""

    def test_an_image_cached_by_request_gets_its_boot_image(self):
        self.publish_boot_image()

        def fetch_to_raw(context, image_id, path, trusted_certs=None):
            self.assertEqual(IMAGE_ID, image_id)
            self.fetch_image(path)
        with mock.patch('nova.virt.images.fetch_to_raw', side_effect=fetch_to_raw):
            self.assertTrue(self.drvr.cache_image(self.context, IMAGE_ID))
        self.assertTrue(self.base.is_file())
        self.assertEqual([self.name], [i['file'] for i in self.client.installs])
        self.assertTrue(self.client.status().usable(self.name))

    def test_an_image_cached_already_has_yolofs_set_its_times(self):
        self.cache_base()
        self.publish_boot_image()
        with mock.patch('nova.privsep.path.utime') as nova_utime:
            self.assertFalse(self.drvr.cache_image(self.context, IMAGE_ID))
        nova_utime.assert_not_called()
        self.client.touch.assert_called_once_with(self.name)
        self.assertTrue(self.client.status().usable(self.name))

    def test_without_yolofs_it_is_novas_caching(self):
        self.cache_base()
        self.yolofs_down()
        with mock.patch('nova.privsep.path.utime') as nova_utime:
            self.assertFalse(self.drvr.cache_image(self.context, IMAGE_ID))
        nova_utime.assert_called_once_with(str(self.base))
        self.assertEqual([], self.client.installs)


class TestBootTiming(DriverTestCase):
    """Each guest spawned is timed, with what the scheduler predicted its boot from."""

    def setUp(self):
        super().setUp()
        self.useFixture(nova_fixtures.fixtures.MockPatchObject(
            libvirt_driver.LibvirtDriver, 'spawn',
            side_effect=lambda *args, **kwargs: self.create_root_disk()))
        self.watch = self.useFixture(nova_fixtures.fixtures.MockPatchObject(
            self.drvr.yolo_report.boot_timer, 'watch')).mock
        self.client.load(io_utilisation=0.25, cpu_utilisation=0.5, runnable_per_cpu=0.75,
                         cpu_pressure=0.125)

    def spawn(self, **kwargs):
        self.drvr.spawn(self.context, self.instance, None, [], None, {}, **kwargs)

    def test_a_boot_from_its_boot_image_is_timed_with_the_hosts_load(self):
        self.cache_base()
        self.publish_boot_image()
        self.spawn()
        self.watch.assert_called_once_with(self.instance, {
            'io_utilisation': 0.25, 'cpu_utilisation': 0.5, 'runnable': 0.75,
            'idlest_cpu_utilisation': None, 'cpu_pressure': 0.125, 'concurrent_boots': 0,
            'boot_image': True, 'streamed': False})

    def test_a_boot_without_one_is_timed_as_a_normal_boot(self):
        self.cache_base()
        self.spawn()
        self.assertFalse(self.watch.call_args.args[1]['boot_image'])
        self.assertFalse(self.watch.call_args.args[1]['streamed'])

    def test_a_first_boot_before_the_download_is_timed_as_streamed(self):
        # Served from its boot image while the fill runs: it measures streamed_boot_factor,
        # even if the fill ended before the guest started (a small image, a fast link).
        self.cache_base()
        make_disk = self.create_root_disk

        def over_fill():
            disk = make_disk()
            self.drvr.yolo_backing.made(disk.path, backing.OVER_FILL)
            return disk
        self.create_root_disk = over_fill       # what Nova's spawn makes (setUp)
        self.spawn()
        conditions = self.watch.call_args.args[1]
        self.assertTrue(conditions['boot_image'])
        self.assertTrue(conditions['streamed'])

    def test_a_boot_right_after_novas_download_is_not_timed(self):
        # The image is in the page cache, its boot image fetched meanwhile: says nothing of
        # this host's boots.
        self.publish_boot_image()
        self.spawn()
        self.wait_for_boot_image_fetch()
        self.watch.assert_not_called()
        self.assertEqual({}, self.drvr.yolo_backing._made)

    def test_the_vcpu_times_come_from_libvirts_domain_stats(self):
        connection = self.drvr._host.get_connection()
        domain = connection.defineXML(self.domain_xml(self.instance_dir / 'disk'))
        domain.create()
        # Nova's fake libvirt has no domain stats: the vCPUs' running times alone.
        self.assertIsNone(self.drvr.yolo_report._vcpu_times(self.instance)[1])
        # The busiest vCPU's running time and its wait for a CPU (schedstat's run delay).
        stats = {'vcpu.current': 2, 'vcpu.0.time': 30 * 10**9, 'vcpu.0.delay': 4 * 10**9,
                 'vcpu.1.time': 2 * 10**9, 'vcpu.1.delay': 9 * 10**9}
        with mock.patch.object(connection, 'domainListGetStats', create=True,
                               return_value=[(domain, stats)]) as get_stats:
            self.assertEqual((30.0, 4.0), self.drvr.yolo_report._vcpu_times(self.instance))
            del stats['vcpu.0.delay']      # a libvirt older than the delay
            self.assertEqual((30.0, None), self.drvr.yolo_report._vcpu_times(self.instance))
        self.assertEqual(host_report.LIBVIRT_STATS_VCPU, get_stats.call_args.args[1])

    def test_the_disk_seconds_come_from_libvirts_domain_stats(self):
        connection = self.drvr._host.get_connection()
        domain = connection.defineXML(self.domain_xml(self.instance_dir / 'disk'))
        domain.create()
        self.assertIsNone(self.drvr.yolo_report._disk_seconds(self.instance))
        # Every disk's reads, writes and flushes (a config drive's too), in nanoseconds.
        stats = {'block.count': 2, 'block.0.rd.times': 700 * 10**6,
                 'block.0.wr.times': 40 * 10**6, 'block.0.fl.times': 10 * 10**6,
                 'block.1.rd.times': 250 * 10**6}
        with mock.patch.object(connection, 'domainListGetStats', create=True,
                               return_value=[(domain, stats)]) as get_stats:
            reads, writes = self.drvr.yolo_report._disk_seconds(self.instance)
        self.assertAlmostEqual(0.95, reads)
        self.assertAlmostEqual(0.05, writes)
        self.assertEqual(host_report.LIBVIRT_STATS_BLOCK, get_stats.call_args.args[1])

    def test_nothing_is_timed_without_yolofs_a_start_or_a_pattern(self):
        self.yolofs_down()
        self.spawn()
        self.yolofs_up()
        self.spawn(power_on=False)
        self.client.load(io_utilisation=0.1)   # no cpu_utilisation
        with self.assertLogs(host_report.LOG.logger, 'WARNING'):
            self.spawn()
        self.client.load(io_utilisation=0.1, cpu_utilisation=0.1)
        with mock.patch.object(self.drvr.yolo_report, '_served_from',
                               side_effect=OSError):
            self.spawn()
        self.watch.assert_not_called()
        self.flags(boot_ready_pattern='', group='yolo')
        self.assertIsNone(self.drvr.yolo_report._make_boot_timer())
        self.flags(boot_ready_pattern='login: (', group='yolo')
        with self.assertLogs(host_report.LOG.logger, 'ERROR'):
            self.assertIsNone(self.drvr.yolo_report._make_boot_timer())


class TestFailedFirstBoot(DriverTestCase):
    """A fill that fails under a started guest fails its server as a failed download would."""

    def setUp(self):
        super().setUp()
        self.fill = mock.Mock(image_id=IMAGE_ID, reason='Glance sent 3 of the image\'s 8 bytes',
                              disks={str(self.instance_dir / 'disk')})
        self.domain = self.drvr._host.get_connection().defineXML(
            self.domain_xml(self.instance_dir / 'disk'))
        self.domain.create()
        self.saved = self.useFixture(nova_fixtures.fixtures.MockPatchObject(
            self.instance, 'save')).mock
        self.faults = self.useFixture(nova_fixtures.fixtures.MockPatchObject(
            yolo_driver.compute_utils, 'add_instance_fault_from_exc')).mock
        self.useFixture(nova_fixtures.fixtures.MockPatchObject(
            objects.Instance, 'get_by_uuid', lambda context, uuid: self.instance))
        self.useFixture(nova_fixtures.fixtures.MockPatchObject(
            yolo_driver.error_once_built.retry, 'sleep', lambda seconds: None))
        self.instance.host = yolo_driver.CONF.host

    def test_the_first_boot_option_has_the_driver_fail_the_guests(self):
        self.flags(first_boot_before_download=True, group='yolo')
        drvr = virt_driver.load_compute_driver(fake_virt.FakeVirtAPI(), 'yolo.YoloLibvirtDriver')
        self.assertEqual(drvr._yolo_fail_guests_of, drvr.yolo_first_boots.on_failed)

    def test_guests_over_a_fill_an_earlier_nova_compute_left_are_stopped_in_error(self):
        self.flags(first_boot_before_download=True, group='yolo')
        drvr = virt_driver.load_compute_driver(fake_virt.FakeVirtAPI(), 'yolo.YoloLibvirtDriver')
        drvr.yolo_backing.client = drvr.yolo_first_boots.client = self.client
        self.client.fill_end = mock.Mock()
        # The fill under way when nova-compute stopped, and a guest running over it.
        write_raw_base(self.mount / self.name)
        fill_file = first_boot.fill_name(self.name)
        (self.base_dir / fill_file).write_bytes(b'')
        self.instance_dir.mkdir()
        images.create_overlay(self.mount / self.name, self.instance_dir / 'disk')
        self.domain = drvr._host.get_connection().defineXML(
            self.domain_xml(self.instance_dir / 'disk'))
        self.domain.create()
        self.instance.vm_state = 'active'
        with mock.patch.object(libvirt_driver.LibvirtDriver, 'init_host'):
            drvr.init_host('h')
        self.assertEqual([], os.listdir(self.base_dir))
        self.client.fill_end.assert_called_once_with(fill_file, complete=False,
                                                     reason='nova-compute restarted')
        self.assertFalse(self.domain.isActive())
        self.assertEqual('error', self.instance.vm_state)
        self.assertIn('nova-compute restarted before the download ended',
                      str(self.faults.call_args[0][2]))

    def test_a_new_host_makes_base_so_that_yolofs_is_up_before_its_first_boot(self):
        self.flags(first_boot_before_download=True, group='yolo')
        drvr = virt_driver.load_compute_driver(fake_virt.FakeVirtAPI(), 'yolo.YoloLibvirtDriver')
        drvr.yolo_backing.client = drvr.yolo_first_boots.client = self.client
        shutil.rmtree(self.base_dir)
        with mock.patch.object(libvirt_driver.LibvirtDriver, 'init_host'), \
                mock.patch.object(yolo_driver.LOG, 'exception') as logged:
            drvr.init_host('h')
        self.assertTrue(self.base_dir.is_dir())
        logged.assert_not_called()

    def test_an_active_server_is_stopped_and_put_in_error_with_the_reason(self):
        self.instance.vm_state = 'active'
        self.drvr._yolo_fail_guests_of(self.fill)
        self.assertFalse(self.domain.isActive())
        self.assertEqual(('error', None), (self.instance.vm_state, self.instance.task_state))
        self.saved.assert_called_once_with()
        failure = self.faults.call_args[0][2]
        self.assertIsInstance(failure, yolo_driver.FirstBootFailed)
        self.assertIn("failed after the server had started: Glance sent 3 of the image's 8 "
                      "bytes", str(failure))

    def test_a_build_under_way_is_left_to_fail_by_itself_unless_it_ends_active(self):
        states = iter(['building', 'building', 'active'])
        self.useFixture(nova_fixtures.fixtures.MockPatchObject(
            objects.Instance, 'get_by_uuid',
            lambda context, uuid: setattr(self.instance, 'vm_state', next(states))
            or self.instance))
        self.drvr._yolo_fail_guests_of(self.fill)
        self.assertEqual('error', self.instance.vm_state)
        self.faults.assert_called_once()

    def test_a_build_rescheduled_elsewhere_is_not_touched(self):
        self.instance.vm_state, self.instance.host = 'building', 'another-host'
        self.drvr._yolo_fail_guests_of(self.fill)
        self.assertFalse(self.domain.isActive())
        self.saved.assert_not_called()
        self.faults.assert_not_called()
