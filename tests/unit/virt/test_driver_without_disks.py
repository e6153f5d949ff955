"""YoloLibvirtDriver's parts that need neither disks nor root, on Nova's own test fixtures.

The driver with real disks (``qemu-img``, the yolofs binary, Nova's privileged helpers as root)
is tested in tests/functional/test_nova_driver_fakelibvirt.py.
"""

from unittest import mock

from nova.tests import fixtures as nova_fixtures
from nova.virt import driver as virt_driver
from nova.virt import fake as fake_virt
from nova.virt.libvirt import driver as libvirt_driver

from tests.unit import nova_base
from yolo_nova.virt import backing
from yolo_nova.virt import driver as yolo_driver


class TestLoading(nova_base.NoDBTestCase):

    def test_loaded_from_nova_virt_as_compute_driver_option(self):
        self.useFixture(nova_fixtures.LibvirtFixture())
        drvr = virt_driver.load_compute_driver(fake_virt.FakeVirtAPI(), 'yolo.YoloLibvirtDriver')
        self.assertIsInstance(drvr, yolo_driver.YoloLibvirtDriver)
        self.assertIsInstance(drvr, libvirt_driver.LibvirtDriver)
        self.assertEqual('YoloQcow2', drvr.image_backend.backend('qcow2').__name__)
        self.assertEqual('YoloQcow2', drvr.image_backend.backend('default').__name__)
        self.assertNotIn('ironic', type(drvr).__name__.lower())


class TestQcow2DisksInXml(nova_base.NoDBTestCase):

    def test_only_file_qcow2_disks(self):
        xml = ("<domain><devices>"
               "<disk type='file'><driver type='qcow2'/><source file='/i/disk'/></disk>"
               "<disk type='file'><driver type='raw'/><source file='/i/disk.config'/></disk>"
               "<disk type='block'><driver type='raw'/><source dev='/dev/sdb'/></disk>"
               "<disk type='network'><driver type='raw'/><source name='vol'/></disk>"
               "</devices></domain>")
        self.assertEqual(['/i/disk'], yolo_driver.qcow2_file_disks(xml))


class PrivilegedRebaseTestCase(nova_base.NoDBTestCase):
    """Rebases of instance disks run as root in Nova's own privsep daemon: nova-compute is not
    root, and a running guest's disk belongs to libvirt's QEMU user."""

    def test_rebase_is_an_entrypoint_of_novas_sys_admin_context(self):
        import nova.privsep
        from nova.virt import yolo
        self.assertTrue(nova.privsep.sys_admin_pctxt.is_entrypoint(yolo.rebase_unsafe))

    def test_backing_files_rebase_through_it(self):
        from nova.virt import yolo
        with mock.patch.object(yolo, 'rebase_unsafe') as privileged:
            backing.rebase_unsafe('/i/disk', '/m/base', 'raw')
        privileged.assert_called_once_with('/i/disk', '/m/base', 'raw')
