"""YoloLibvirtDriver's parts that need neither disks nor root, on Nova's own test fixtures.

The driver with real disks (``qemu-img``, the yolofs binary, Nova's privileged helpers as root)
is tested in tests/functional/test_nova_driver_fakelibvirt.py.
"""

import dataclasses
import os
import time
from unittest import mock

import fixtures
from nova.compute import provider_tree
from nova import exception as nova_exception
from nova.tests import fixtures as nova_fixtures
from nova.virt import driver as virt_driver
from nova.virt import fake as fake_virt
from nova.virt.libvirt import driver as libvirt_driver
from oslo_utils.fixture import uuidsentinel as uuids

from tests.unit import nova_base
from yolo_common import yolofs
from yolo_nova.model import calibration
from yolo_nova.model import estimators
from yolo_nova.virt import backing
from yolo_nova.virt import detach
from yolo_nova.virt import driver as yolo_driver
from yolo_nova.virt import host_report
from yolo_nova.virt import warming


def load_driver(test):
    """The driver as nova-compute loads it, on Nova's libvirt fixture."""
    test.useFixture(nova_fixtures.LibvirtFixture())
    return virt_driver.load_compute_driver(fake_virt.FakeVirtAPI(), 'yolo.YoloLibvirtDriver')


class TestLoading(nova_base.NoDBTestCase):

    def test_loaded_from_nova_virt_as_compute_driver_option(self):
        self.useFixture(nova_fixtures.LibvirtFixture())
        drvr = virt_driver.load_compute_driver(fake_virt.FakeVirtAPI(), 'yolo.YoloLibvirtDriver')
        self.assertIsInstance(drvr, yolo_driver.YoloLibvirtDriver)
        self.assertIsInstance(drvr, libvirt_driver.LibvirtDriver)
        self.assertEqual('YoloQcow2', drvr.image_backend.backend('qcow2').__name__)
        self.assertEqual('YoloQcow2', drvr.image_backend.backend('default').__name__)
        self.assertNotIn('ironic', type(drvr).__name__.lower())

    def test_with_warming_off_the_warm_store_is_emptied(self):
        self.useFixture(nova_fixtures.LibvirtFixture())
        for flags in ({'warm_budget_mb': 0}, {'fetch_boot_images': False}):
            downloads = self.useFixture(fixtures.TempDir()).path
            store = os.path.join(downloads, 'warm')
            os.makedirs(store)
            held = os.path.join(store, 'image.boot-image.yolo')
            with open(held, 'wb') as f:
                f.write(b'x' * 4096)
            self.flags(download_dir=downloads, warm_budget_mb=4096, fetch_boot_images=True,
                       group='yolo')
            self.flags(group='yolo', **flags)
            drvr = virt_driver.load_compute_driver(fake_virt.FakeVirtAPI(),
                                                   'yolo.YoloLibvirtDriver')
            self.assertIsNone(drvr.yolo_warmer)
            self.assertFalse(os.path.exists(held), flags)

    def test_base_files_kept_as_downloaded_are_refused_at_start(self):
        self.flags(force_raw_images=False)
        drvr = load_driver(self)
        with mock.patch.object(libvirt_driver.LibvirtDriver, 'init_host') as libvirt_init:
            error = self.assertRaises(nova_exception.InvalidConfiguration, drvr.init_host, 'h')
        self.assertIn('force_raw_images = False', str(error))
        libvirt_init.assert_not_called()
        self.flags(enabled=False, group='yolo')
        with mock.patch.object(libvirt_driver.LibvirtDriver, 'init_host') as libvirt_init:
            drvr.init_host('h')
        libvirt_init.assert_called_once_with('h')


class TestAvailableResource(nova_base.NoDBTestCase):
    """The resource tracker's periodic call: YOLO adds its stats, and never makes it fail."""

    def setUp(self):
        super().setUp()
        self.drvr = load_driver(self)
        self.useFixture(fixtures.MockPatchObject(
            libvirt_driver.LibvirtDriver, 'get_available_resource',
            side_effect=lambda nodename: {'vcpus': 2, 'stats': {'other': 'kept'}}))
        self.client = self.drvr.yolo_backing.client
        self.useFixture(fixtures.MockPatchObject(
            self.drvr.yolo_backing, 'status',
            return_value=yolofs.Status.from_answer({'boot_images': []})))

    def test_a_healthy_yolofs_reports_its_state(self):
        load = yolofs.HostLoad(io_utilisation=0.25, cpu_utilisation=0.5, iops=10.0,
                               bytes_per_second=1e6, runnable_per_cpu=0.1)
        with mock.patch.object(self.client, 'host_load', return_value=load):
            stats = self.drvr.get_available_resource('node')['stats']
        self.assertEqual('true', stats['yolo_active'])
        self.assertEqual('kept', stats['other'])
        self.assertIn('yolo_io_utilisation', stats)
        self.assertEqual('0', stats['yolo_first_boot_images_without_ranges'])
        self.drvr.yolo_first_boots._ranges.update({'on-rbd': False, 'on-file': True})
        with mock.patch.object(self.client, 'host_load', return_value=load):
            stats = self.drvr.get_available_resource('node')['stats']
        self.assertEqual('1', stats['yolo_first_boot_images_without_ranges'])

    def test_hosts_whose_disks_are_not_qcow2_over_base_stay_out_of_the_way(self):
        load = yolofs.HostLoad(io_utilisation=0.25, cpu_utilisation=0.5)
        for images_type, cow in (('rbd', True), ('lvm', True), ('flat', True), ('raw', True),
                                 ('ploop', True), ('default', False)):
            self.flags(images_type=images_type, group='libvirt')
            self.flags(use_cow_images=cow)
            drvr = self.drvr
            with mock.patch.object(libvirt_driver.LibvirtDriver, 'init_host'), \
                    self.assertLogs(yolo_driver.LOG.logger, 'WARNING') as logged:
                drvr.init_host('h')
            self.assertEqual(1, len(logged.records), logged.output)
            self.assertIn('images_type = %s' % images_type, logged.output[0])
            with mock.patch.object(self.client, 'host_load', return_value=load):
                stats = drvr.get_available_resource('node')['stats']
            self.assertEqual({'other': 'kept', 'yolo_active': 'false'}, stats, images_type)
        for images_type, cow in (('qcow2', False), ('default', True)):
            self.flags(images_type=images_type, group='libvirt')
            self.flags(use_cow_images=cow)
            self.assertTrue(yolo_driver.yolo_serves_disks())

    def test_boots_under_way_are_not_in_the_reported_load(self):
        # The scheduler counts the boots under way apart (num_io_ops): while guests boot here,
        # and until their load has left yolofs' smoothed figures, the host reports the load
        # from before they started, so that they neither count twice nor linger in the report.
        report = self.drvr.yolo_report
        timer = report.boot_timer
        self.assertIsNotNone(timer)
        quiet = yolofs.HostLoad(io_utilisation=0.1, cpu_utilisation=0.2, cpu_pressure=0.05,
                                smoothing_seconds=10.0)
        booting = dataclasses.replace(quiet, cpu_utilisation=0.7, cpu_pressure=0.45)
        clock = [1000.0]

        def reported(load):
            with mock.patch.object(self.client, 'host_load', return_value=load):
                stats = self.drvr.get_available_resource('node')['stats']
            return stats['yolo_cpu_utilisation'], stats['yolo_cpu_pressure']

        def conditions(load, uuid):
            with mock.patch.object(self.client, 'host_load', return_value=load):
                return report._boot_conditions(mock.Mock(uuid=uuid))

        with mock.patch.object(timer, '_run'), \
                mock.patch.object(time, 'monotonic', side_effect=lambda: clock[0]):
            self.assertEqual(('0.7000', '0.4500'), reported(booting))   # no boot: as measured
            first = conditions(quiet, 'a')
            self.assertEqual((0.2, 0.05, 0), (first['cpu_utilisation'], first['cpu_pressure'],
                                              first['concurrent_boots']))
            # While Nova spawns it, before the timer has it (its disk, its domain).
            report._spawning += 1
            self.assertEqual(('0.2000', '0.0500'), reported(booting))
            timer.watch(mock.Mock(uuid='a'), first)
            report._spawning -= 1
            clock[0] += 20
            self.assertEqual(('0.2000', '0.0500'), reported(booting))
            # A boot asked for meanwhile started in that load too, beside the first.
            second = conditions(booting, 'b')
            self.assertEqual((0.2, 1), (second['cpu_utilisation'], second['concurrent_boots']))
            # The guests are ready: their load leaves the smoothed figures within 30 s.
            timer._timing.clear()
            timer._last_ended = clock[0]
            clock[0] += 29
            self.assertEqual(('0.2000', '0.0500'), reported(booting))
            clock[0] += 2
            self.assertEqual(('0.7000', '0.4500'), reported(booting))
            # Boots one after another: the load from before them is kept no longer than a
            # boot counts as under way (twice an idle boot's time) plus those 30 s.
            conditions(quiet, 'c')
            window = host_report.booting_window(report.calibration())
            for _ in range(int(window + 30) // 20):
                timer.watch(mock.Mock(uuid='c'), first)
                clock[0] += 20
                self.assertEqual(('0.2000', '0.0500'), reported(booting))
            timer.watch(mock.Mock(uuid='c'), first)
            clock[0] += 20
            self.assertEqual(('0.7000', '0.4500'), reported(booting))

    def test_anything_going_wrong_reports_yolo_inactive_and_never_raises(self):
        for failure in ({'side_effect': yolofs.YolofsError('an answer without its keys')},
                        {'return_value': yolofs.HostLoad(io_utilisation=None,
                                                         cpu_utilisation='x')},
                        {'side_effect': RuntimeError('unexpected')}):
            with mock.patch.object(self.client, 'host_load', **failure):
                stats = self.drvr.get_available_resource('node')['stats']
            self.assertEqual({'other': 'kept', 'yolo_active': 'false'}, stats, failure)
        with mock.patch.object(self.drvr.yolo_report, 'calibration',
                               side_effect=ZeroDivisionError):
            stats = self.drvr.get_available_resource('node')['stats']
        self.assertEqual('false', stats['yolo_active'])


class TestCalibration(nova_base.NoDBTestCase):
    """The parameters a host reports: nova.conf's, else its own timed boots', else the
    calibration file's if its boots ran under this host's accelerator."""

    def setUp(self):
        super().setUp()
        self.useFixture(nova_fixtures.LibvirtFixture())
        self.tmp = self.useFixture(fixtures.TempDir())
        self.flags(calibration_file=self.tmp.join('calibration.json'),
                   observed_boots_file=self.tmp.join('observed-boots.json'), group='yolo')
        self.flags(virt_type='qemu', group='libvirt')
        calibration.save(estimators.from_boots([(10.0, 3.0)], [(4.0, 3.5)], cpus=2,
                                               accel='tcg'), self.tmp.join('calibration.json'))
        self.drvr = virt_driver.load_compute_driver(fake_virt.FakeVirtAPI(),
                                                    'yolo.YoloLibvirtDriver')

    def test_a_file_from_another_accelerator_is_ignored(self):
        self.assertEqual((6.5, 3.5, 0.5), self._parameters())
        self.flags(virt_type='kvm', group='libvirt')
        with self.assertLogs(host_report.LOG.logger, 'WARNING') as logs:
            self.assertEqual(self._parameters(), (host_report.UNCALIBRATED.alpha,
                                                  host_report.UNCALIBRATED.beta,
                                                  host_report.UNCALIBRATED.alpha_yolo))
        self.assertIn('its boots ran under tcg', logs.output[0])

    def test_the_hosts_own_boots_win_over_the_file_and_nova_conf_over_both(self):
        def boot(seconds, cpu_seconds, boot_image, accel='tcg'):
            return estimators.ObservedBoot(
                started_at=0.0, seconds=seconds, cpu_seconds=cpu_seconds,
                boot_image=boot_image, io_utilisation=0.0, cpu_utilisation=0.0, accel=accel)
        served = [boot(31.0, 30.0, True), boot(32.0, 30.5, True), boot(30.5, 29.5, True)]
        estimators.save_observed(served + [boot(36.0, 35.0, False)] * 2
                                 + [boot(99.0, 99.0, True, accel='kvm')] * 3,
                                 self.tmp.join('observed-boots.json'))
        # Three boots from a boot image (the default learn_from_boots): beta and alpha_yolo
        # are theirs; two normal ones are not enough for alpha; the KVM boots do not count.
        self.assertEqual((6.5, 30.0, 1.0), self._parameters())
        self.flags(learn_from_boots=2, group='yolo')
        self.assertEqual((6.0, 30.0, 1.0), self._parameters())
        self.flags(boot_time_beta=20.0, group='yolo')
        self.assertEqual((6.0, 20.0, 1.0), self._parameters())
        self.flags(learn_from_boots=0, boot_time_beta=None, group='yolo')
        self.assertEqual((6.5, 3.5, 0.5), self._parameters())

    def test_a_pole_learned_from_boots_under_load_goes_with_its_alpha(self):
        def boot(seconds, disk, io):
            return estimators.ObservedBoot(
                started_at=0.0, seconds=seconds, cpu_seconds=30.0, boot_image=True,
                io_utilisation=io, cpu_utilisation=0.0, accel='tcg', cpu_delay_seconds=0.5,
                disk_seconds=disk)
        # Quiet boots' requests took 0.5 s, a boot's at x 0.99 5 s: ten times, not 100 e^k.
        estimators.save_observed([boot(31.0, 0.5, 0.0)] * 3 + [boot(35.5, 5.0, 0.99)],
                                 self.tmp.join('observed-boots.json'))
        self.flags(io_exponent=0.0, group='yolo')      # k is used to learn, not only after
        known = self.drvr.yolo_report.calibration()
        self.assertEqual((0.5, 0.5, 0.0), (known.alpha_yolo, known.io_pole_yolo,
                                           known.io_exponent))
        self.flags(boot_time_alpha_yolo=0.8, group='yolo')
        known = self.drvr.yolo_report.calibration()
        self.assertEqual((0.8, 1.0), (known.alpha_yolo, known.io_pole_yolo))

    def _parameters(self):
        known = self.drvr.yolo_report.calibration()
        return known.alpha, known.beta, known.alpha_yolo


class TestQcow2DisksInXml(nova_base.NoDBTestCase):

    def test_only_file_qcow2_disks(self):
        xml = ("<domain><devices>"
               "<disk type='file'><driver type='qcow2'/><source file='/i/disk'/></disk>"
               "<disk type='file'><driver type='raw'/><source file='/i/disk.config'/></disk>"
               "<disk type='block'><driver type='raw'/><source dev='/dev/sdb'/></disk>"
               "<disk type='network'><driver type='raw'/><source name='vol'/></disk>"
               "</devices></domain>")
        self.assertEqual([(None, '/i/disk', False)], detach.qcow2_file_disks(xml))


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


class TestProviderTraits(nova_base.NoDBTestCase):
    """The resource tracker's provider tree: one trait says what keeps boot images verified."""

    def setUp(self):
        super().setUp()
        self.drvr = load_driver(self)
        # Libvirt's own inventory and CPU traits need a host: not what is tested here.
        self.useFixture(fixtures.MockPatchObject(
            libvirt_driver.LibvirtDriver, 'update_provider_tree', return_value=None))
        self.tree = provider_tree.ProviderTree()
        self.tree.new_root('node', uuids.node)
        self.tree.update_traits('node', ['HW_CPU_X86_AVX', 'CUSTOM_YOLO_TOUCH_SAFETY_NONE'])

    def traits_with(self, answer):
        """The traits with yolofs' status ``answer`` (None: yolofs down)."""
        status = yolofs.Status.from_answer(answer) if answer is not None else None
        with mock.patch.object(self.drvr.yolo_backing, 'status', return_value=status):
            self.drvr.update_provider_tree(self.tree, 'node')
        return self.tree.data('node').traits

    def test_the_trait_follows_yolofs_status(self):
        self.assertEqual({'HW_CPU_X86_AVX', 'CUSTOM_YOLO_TOUCH_SAFETY_LEASES'},
                         self.traits_with({'touch_safety': {'mechanism': 'leases'}}))
        self.assertEqual({'HW_CPU_X86_AVX', 'CUSTOM_YOLO_TOUCH_SAFETY_NONE'},
                         self.traits_with({'touch_safety': {'mechanism': 'none'}}))

    def test_no_trait_while_yolofs_is_down_or_says_nothing(self):
        self.assertEqual({'HW_CPU_X86_AVX'}, self.traits_with(None))
        self.assertEqual({'HW_CPU_X86_AVX'}, self.traits_with({'boot_images': []}))

    def test_a_trait_per_warm_image_the_host_holds(self):
        image = '0b5d7c1e-8d5e-4a55-9a57-2f5cbd1c3d3e'
        other = '11111111-2222-4333-8444-555566667777'
        self.tree.update_traits('node', ['HW_CPU_X86_AVX', warming.warm_trait(other)])
        self.drvr.yolo_warmer.warm_image_ids = frozenset([image, other])
        answer = {'boot_images': [{'file': 'f', 'image_id': image, 'verified': True}]}
        self.assertEqual({'HW_CPU_X86_AVX', warming.warm_trait(image)}, self.traits_with(answer))
        # Down: nothing said of what it holds.
        self.assertEqual({'HW_CPU_X86_AVX'}, self.traits_with(None))
