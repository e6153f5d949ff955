"""What YOLO replaces or overrides of Nova's is still there, shaped as YOLO relies on.

One test per replaced function (yolo_nova/virt/nova_patches.py): it exists in the installed
Nova, takes the parameters its wrapper passes on, and Nova still calls it by its module's
attribute (else the replacement would silently change nothing). Then the methods the driver and
the image backend override: a Nova that renames one would never call YOLO's.
"""

import inspect
import os
from unittest import mock

import fixtures

from nova.virt import images
from nova.virt.libvirt import driver as libvirt_driver
from nova.virt.libvirt import imagebackend as nova_imagebackend
from nova.virt.libvirt import migration as libvirt_migrate
from nova.virt.libvirt import utils as libvirt_utils

from tests.unit import nova_base
from yolo_nova.virt import driver as yolo_driver
from yolo_nova.virt import imagebackend
from yolo_nova.virt import nova_patches


def original(module, name):
    """Nova's own function, under YOLO's wrapper if a driver made in this process put one."""
    return inspect.unwrap(getattr(module, name))


def parameters(function):
    return list(inspect.signature(function).parameters)


class TestPatchTargets(nova_base.NoDBTestCase):

    def test_every_patch_is_tested_here(self):
        self.assertEqual(
            [(libvirt_migrate, 'get_updated_guest_xml'),
             (libvirt_utils, 'get_disk_backing_file'),
             (nova_imagebackend, '_update_utime_ignore_eacces'),
             (images, 'fetch'), (images, 'convert_image')],
            [(module, name) for module, name, _ in nova_patches.PATCHES])

    def test_get_updated_guest_xml_makes_the_live_migrations_xml(self):
        function = original(libvirt_migrate, 'get_updated_guest_xml')
        # The wrapper passes every argument on and takes the XML it returns, a string.
        self.assertIn("return etree.tostring(xml_doc, encoding='unicode')",
                      inspect.getsource(function))
        self.assertIn('libvirt_migrate.get_updated_guest_xml(',
                      inspect.getsource(libvirt_driver.LibvirtDriver._live_migration_operation))

    def test_get_disk_backing_file_names_the_live_snapshots_backing_file(self):
        function = original(libvirt_utils, 'get_disk_backing_file')
        self.assertEqual(['path', 'basename', 'format'], parameters(function))
        self.assertIs(True, inspect.signature(function).parameters['basename'].default)
        # The live snapshot asks for the full path, through the module's attribute.
        source = inspect.getsource(libvirt_driver.LibvirtDriver._live_snapshot)
        self.assertIn('libvirt_utils.get_disk_backing_file(', source)
        self.assertIn('basename=False', source)

    def test_update_utime_ignore_eacces_sets_the_base_files_times(self):
        function = original(nova_imagebackend, '_update_utime_ignore_eacces')
        self.assertEqual(['path'], parameters(function))
        # Called by name inside Nova's image backend, where the module's attribute is looked up.
        self.assertIn('_update_utime_ignore_eacces(base)',
                      inspect.getsource(nova_imagebackend.Qcow2.create_image))

    def test_fetch_and_convert_image_are_novas_download_and_conversion_to_a_base_file(self):
        self.assertEqual(['context', 'image_href', 'path', 'trusted_certs'],
                         parameters(original(images, 'fetch')))
        self.assertEqual(['source', 'dest', 'in_format', 'out_format'],
                         parameters(original(images, 'convert_image'))[:4])
        # fetch_to_raw and the driver's cache_image call them through the module's attributes
        # (fetch_to_raw is in the same module: its globals are the module's).
        source = inspect.getsource(images.fetch_to_raw)
        self.assertIn('fetch(context, image_href, path_tmp, trusted_certs)', source)
        self.assertIn('staged = "%s.converted" % path', source)
        self.assertIn("convert_image(path_tmp, staged, fmt, 'raw')", source)
        self.assertIn('images.fetch_to_raw(context, image_id, path)',
                      inspect.getsource(libvirt_driver.LibvirtDriver.cache_image))


class TestTransfersTimed(nova_base.NoDBTestCase):
    """Nova's download and conversion, wrapped, record what they moved and never fail for it."""

    def test_a_download_and_a_conversion_are_recorded_by_their_bytes(self):
        recorded = []
        files = mock.Mock()
        files.transfers.record.side_effect = lambda *a: recorded.append(a)
        tmp = self.useFixture(fixtures.TempDir()).path
        part, converted = os.path.join(tmp, 'x.part'), os.path.join(tmp, 'x.converted')

        def download(context, image_href, path, trusted_certs=None):
            with open(path, 'wb') as f:
                f.write(b'x' * 1000)
        fetch = nova_patches.timing_downloads(download)
        fetch.backing_files = files
        fetch(None, 'image', part)

        def convert(source, dest, in_format, out_format, *args, **kwargs):
            with open(dest, 'wb') as f:
                f.truncate(4000)
        conversion = nova_patches.timing_conversions(convert)
        conversion.backing_files = files
        conversion(part, converted, 'qcow2', 'raw')
        # A snapshot's conversion is not the making of a base file.
        conversion(part, os.path.join(tmp, 'snapshot'), 'raw', 'qcow2')
        # A conversion counts the download's bytes, which the scheduler knows of an image.
        self.assertEqual([('download', 1000), ('conversion', 1000)],
                         [(kind, nbytes) for kind, nbytes, _ in recorded])

        files.transfers.record.side_effect = OSError('disk full')
        fetch(None, 'image', part)     # does not raise


def own_methods(cls):
    """The functions ``cls`` defines itself, by name (YOLO's own helpers are ``_yolo_*``)."""
    return {name: value for name, value in vars(cls).items()
            if callable(value) and not name.startswith('_yolo_')
            and (name == '__init__' or not name.startswith('__'))}


class TestOverriddenMethods(nova_base.NoDBTestCase):

    def assert_overrides(self, cls, nova_cls):
        for name, method in own_methods(cls).items():
            self.assertTrue(hasattr(nova_cls, name), '%s.%s: Nova has no %s' % (
                cls.__name__, name, name))
            # The parameters Nova passes, by the names YOLO's method takes them.
            self.assertEqual(parameters(getattr(nova_cls, name)),
                             parameters(method)[:len(parameters(getattr(nova_cls, name)))],
                             '%s.%s' % (cls.__name__, name))

    def test_the_drivers_overrides_are_of_novas_methods(self):
        self.assert_overrides(yolo_driver.YoloLibvirtDriver, libvirt_driver.LibvirtDriver)
        # Private methods the driver calls.
        self.assertEqual(['self', 'instance', 'backend'], parameters(
            libvirt_driver.LibvirtDriver._needs_rebase_original_qcow2_image))

    def test_the_methods_run_under_the_detach_lock_take_an_instance(self):
        for name in yolo_driver.SERIALIZED_WITH_DETACH:
            self.assertIn('instance', parameters(getattr(libvirt_driver.LibvirtDriver, name)),
                          name)

    def test_the_image_backends_overrides_are_of_novas_methods(self):
        self.assert_overrides(imagebackend.YoloQcow2, nova_imagebackend.Qcow2)
        self.assert_overrides(imagebackend.YoloBackend, nova_imagebackend.Backend)
        # The backend's table of image types, which YoloBackend changes for qcow2.
        backends = nova_imagebackend.Backend(True).BACKEND
        self.assertIs(nova_imagebackend.Qcow2, backends['qcow2'])
        self.assertIs(nova_imagebackend.Qcow2, backends['default'])
