"""YoloLibvirtDriver for real: Nova's image backend over a real yolofs mount, real QEMU boots,
and a real libvirtd.

Glance is the only thing faked (an in-memory image API: tests/functional of yolo_glance runs the
real one). Nova's privileged helpers run in-process (these tests run as root).
"""

import pathlib
import shutil
import time
import uuid
import xml.etree.ElementTree as ET

import fixtures
from nova.compute import power_state
import nova.conf
from nova import context as nova_context
from nova import objects
from nova.tests import fixtures as nova_fixtures
from nova.tests.unit import fake_instance
from nova.virt import driver as virt_driver
from nova.virt import fake as fake_virt
from oslo_config import fixture as config_fixture
import pytest

from tests.functional.test_nova_driver_fakelibvirt import FakeImageAPI
from tests import guest_disk
from yolo_common import images
from yolo_common import qemu
from yolo_common import yolofs
from yolo_nova.model import host_stats
from yolo_nova.virt import backing

CONF = nova.conf.CONF
BOOT_TIMEOUT = 900
GiB = 1 << 30


@pytest.fixture
def nova_host(image_cache, tmp_path):
    """Nova's configuration for a compute host whose image cache holds the test image."""
    instances = image_cache.parent.parent
    with fixtures.Fixture() as scope:
        conf = scope.useFixture(config_fixture.Config(CONF))
        scope.useFixture(nova_fixtures.PrivsepFixture())
        conf.config(instances_path=str(instances), use_cow_images=True, force_raw_images=True)
        conf.config(images_type='qcow2', virt_type='qemu', group='libvirt')
        conf.config(mount_point=str(tmp_path / 'mnt0'),
                    control_socket=str(tmp_path / 'control0.sock'),
                    download_dir=str(tmp_path / 'downloads'), group='yolo')
        yield scope


def make_driver(image_api):
    drvr = virt_driver.load_compute_driver(fake_virt.FakeVirtAPI(), 'yolo.YoloLibvirtDriver')
    drvr.yolo_boot_images._image_api = image_api
    drvr.yolo_boot_images._boot_image_api = image_api
    return drvr


def make_instance(context, image_id):
    instance = fake_instance.fake_instance_obj(
        context, uuid=str(uuid.uuid4()), image_ref=image_id,
        flavor=objects.Flavor(root_gb=4, ephemeral_gb=0, swap=0, extra_specs={}))
    instance.system_metadata = {}
    instance.numa_topology = None
    instance.trusted_certs = None
    return instance


def create_root_disk(drvr, context, instance, base):
    disk = drvr.image_backend.by_name(instance, 'disk')

    def fetch(target, **kwargs):
        raise AssertionError('the base file is already cached: %s' % target)
    disk.cache(fetch_func=fetch, context=context, filename=base.name,
               image_id=instance.image_ref, size=instance.flavor.root_gb * GiB)
    return pathlib.Path(disk.path)


def start_with_driver(drvr, context, instance, disk):
    """The driver's start path (_create_guest) up to libvirt, which is not used here."""
    xml = ("<domain type='qemu'><devices><disk type='file' device='disk'>"
           "<driver name='qemu' type='qcow2'/><source file='%s'/></disk></devices></domain>" % disk)
    with fixtures.MockPatch('nova.virt.libvirt.driver.LibvirtDriver._create_guest'):
        drvr._create_guest(context, xml, instance)


def test_root_disk_on_the_mount_learns_boots_and_falls_back(nova_host, image_cache,
                                                            mount_factory, tmp_path):
    base = image_cache
    image_id = str(uuid.uuid4())
    glance = FakeImageAPI()
    glance.images[image_id] = {'properties': {}}  # no published boot image: learn it here
    mount = mount_factory(base.parent, boot_images=tmp_path / 'boot-images', learn=True,
                          record_idle_secs=600, record_max_secs=1800)
    drvr = make_driver(glance)
    context = nova_context.get_admin_context()
    instance = make_instance(context, image_id)

    # Nova creates the root disk (and resizes it to the flavor's 4 GiB): backed by the mount.
    disk = create_root_disk(drvr, context, instance, base)
    info = images.info(disk)
    assert info['backing-filename'] == str(mount.mountpoint / base.name)
    assert info['backing-filename-format'] == 'raw'
    assert info['virtual-size'] == 4 * GiB
    # Nova's own qemu-img runs (the resize) did not go through yolofs: no recording yet.
    assert mount.client.status().recording == frozenset()

    # First boot: yolofs records it and learns the image's boot image.
    start_with_driver(drvr, context, instance, disk)
    with qemu.Guest(disk, console_log=tmp_path / 'boot1.log') as guest:
        guest.wait_ready(BOOT_TIMEOUT)
    assert mount.client.record_stop(base.name)['built'] is True
    yolofs.run('verify', tmp_path / 'boot-images' / (base.name + '.yolo'), base)
    # The driver told yolofs the base file's image before the boot: the learned boot image is
    # attributed to it.
    learned = mount.client.status().boot_images[base.name]
    assert (learned.image_id, learned.verified) == (image_id, True)

    # yolofs goes down: the start path rebases the disk back onto _base and the guest boots.
    mount.stop()
    assert not yolofs.is_mounted(mount.mountpoint)
    start_with_driver(drvr, context, instance, disk)
    assert images.info(disk)['backing-filename'] == str(base)
    with qemu.Guest(disk, console_log=tmp_path / 'boot2.log') as guest:
        guest.wait_ready(BOOT_TIMEOUT)


def domain_xml(instance, disk, console_log):
    return qemu.libvirt_domain_xml('instance-' + instance.uuid[:8], disk, console_log,
                                   uuid=instance.uuid)


def test_libvirt_boots_the_driver_disk_from_the_boot_image_then_leaves_the_mount(
        nova_host, libvirtd, world_readable_dir, debian_image, debian_image_tree_digest,
        mount_factory, tmp_path):
    """The driver's disk boots from the boot image under libvirt; once the boot is over the
    running guest moves to _base, so that it outlives yolofs: killed, the guest reads every block
    of its disk without an I/O error, and its files are the source's."""
    # A host of its own, in a directory libvirt's QEMU user can reach.
    root = world_readable_dir
    image_id = str(uuid.uuid4())
    base = root / 'instances' / '_base' / images.base_file_name(image_id)
    base.parent.mkdir(parents=True)
    images.convert_to_raw(debian_image, base)
    (root / 'instances').chmod(0o755)
    nova_host.useFixture(config_fixture.Config(CONF)).config(
        instances_path=str(root / 'instances'))

    # Glance publishes a boot image for the image (learned here from one boot, as
    # yolo-glance-worker does); the driver fetches and verifies it when the base is cached.
    published = tmp_path / 'published.yolo'
    learner = mount_factory(base.parent, boot_images=tmp_path / 'learned', learn=True,
                            record_idle_secs=600, record_max_secs=1800)
    overlay = tmp_path / 'learn.qcow2'
    images.create_overlay(learner.mountpoint / base.name, overlay)
    with qemu.Guest(overlay, console_log=tmp_path / 'learn.log') as guest:
        guest.wait_ready(BOOT_TIMEOUT)
    assert learner.client.record_stop(base.name)['built'] is True
    learner.stop()
    shutil.copyfile(tmp_path / 'learned' / (base.name + '.yolo'), published)
    glance = FakeImageAPI()
    glance.images['boot-image'] = {'properties': {'yolo_source_image_id': image_id},
                                   'file': published}
    glance.images[image_id] = {'properties': {'yolo_boot_image_id': 'boot-image'}}

    store = root / 'boot-images'
    # Boot windows end after 5 s without a read: the boot is over soon after the guest is ready.
    mount = yolofs.Mount(base.parent, root / 'yolofs', store, root / 'control.sock',
                         log_path=tmp_path / 'yolofs.log', record_idle_secs=5)
    nova_host.addCleanup(mount.stop)
    mount.start()
    nova_host.useFixture(config_fixture.Config(CONF)).config(
        mount_point=str(mount.mountpoint), control_socket=str(mount.control_socket),
        detach_settle_seconds=5, group='yolo')
    nova_host.useFixture(config_fixture.Config(CONF)).config(
        connection_uri=libvirtd, group='libvirt')
    drvr = make_driver(glance)
    context = nova_context.get_admin_context()
    instance = make_instance(context, image_id)
    disk = create_root_disk(drvr, context, instance, base)
    # Installed by yolofs, which verified it (the driver only downloaded it and handed it over).
    assert (store / (base.name + '.yolo.verified')).exists()
    assert mount.client.status().boot_images[base.name].verified is True
    # No download left (beside the record of what is installed).
    assert [p.name for p in (tmp_path / 'downloads').iterdir() if p.suffix == '.yolo'] == []
    assert images.info(disk)['backing-filename'] == str(mount.mountpoint / base.name)

    console_log = root / 'console.log'
    guest = drvr._create_guest(context, domain_xml(instance, disk, console_log), instance)
    try:
        assert drvr.get_info(instance).state == power_state.RUNNING
        wait_for_console(console_log, qemu.READY_MARKER, count=1)
        stats = mount.client.stats(base.name)[base.name]
        read = stats['bytes_memory'] + stats['bytes_passthrough']
        assert read > 1 << 20, stats
        assert stats['bytes_memory'] / read > 0.8, stats
        assert stats['errors'] == 0, stats
        # The host reports the verified boot image to the scheduler.
        resources = drvr.yolo_report.stats({'vcpus': 2})
        assert resources['yolo_active'] == 'true'
        reported = host_stats.from_stats(resources, max_age=300)
        assert reported.holds_boot_image(image_id) and reported.holds_base_file(image_id)

        # The boot is over: the running guest is moved to _base, its header, live and
        # persistent XML all say so.
        deadline = time.monotonic() + 300
        while instance.uuid not in drvr.yolo_detacher.detached:
            assert time.monotonic() < deadline, 'the guest never left the mount'
            time.sleep(0.5)
        [(dev, first_pivot, second_pivot)] = drvr.yolo_detacher.detached[instance.uuid]
        # Timed in seconds, within the 300 s waited.
        assert dev == 'vda' and 0 < first_pivot < 300 and 0 < second_pivot < 300
        assert images.info(disk)['backing-filename'] == str(base)
        live = ET.fromstring(guest.get_xml_desc())
        assert live.find('./devices/disk/source').get('file') == str(disk)
        assert live.find('./devices/disk/backingStore/source').get('file') == str(base)
        inactive = ET.fromstring(guest.get_xml_desc(dump_inactive=True))
        assert inactive.find('./devices/disk/source').get('file') == str(disk)
        assert not pathlib.Path(str(disk) + '.yolo-detach').exists()

        # yolofs dies (SIGKILL, no keeper): inside the guest, every block of its disk reads
        # without a fault and its files are the source's.
        mount.process.kill()
        mount.process.wait()
        guest_disk.check_guest_reads_its_disk(guest._domain, debian_image_tree_digest)
        assert guest_disk.GUEST_IO_ERROR.findall(read_bytes(console_log)) == []
        assert drvr.get_info(instance).state == power_state.RUNNING
    finally:
        guest.poweroff()
        guest.delete_configuration()


def wait_for_console(console_log, marker, count):
    deadline = time.monotonic() + BOOT_TIMEOUT
    while read_bytes(console_log).count(marker) < count:
        assert time.monotonic() < deadline, read_bytes(console_log)[-800:]
        time.sleep(0.5)


def read_bytes(path):
    try:
        return pathlib.Path(path).read_bytes()
    except FileNotFoundError:
        return b''


def test_yolofs_not_running_means_unhealthy(tmp_path):
    files = backing.BackingFiles(tmp_path / '_base', tmp_path / 'mnt', tmp_path / 'sock', 1.0)
    assert files.yolofs_healthy() is False
