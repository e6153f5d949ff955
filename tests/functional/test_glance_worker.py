"""yolo-glance-worker against a real in-process Glance API (glance 33's functional test base).

Images are uploaded with python-glanceclient, as ``openstack image create --file`` does, over
HTTP intercepted into Glance's WSGI application. Glance's own notifier sends the real
notifications over oslo.messaging's in-memory ``fake`` transport, which the worker listens to
with its notification listener. The worker then downloads the image, converts it to raw, boots
it (QEMU, TCG) through a learning yolofs mount and publishes the boot image. What is not real:
Keystone (a middleware puts the admin identity keystonemiddleware would in the request).
"""

import io
import os
import pathlib
import shutil
import subprocess
import time
import uuid

import fixtures
import glance
import glance.async_.flows.api_image_import  # noqa: F401 (registers [image_import_opts])
from glance.tests import functional
from glanceclient import exc as glance_exc
from oslo_config import cfg
import oslo_messaging
from oslo_messaging import opts as messaging_opts
import pytest
import tenacity
import wsgi_intercept
from wsgi_intercept import requests_intercept

from yolo_common import configure
from yolo_common import contract
from yolo_common import images
from yolo_common import signing
from yolo_common import yolofs
from yolo_glance import conf as yolo_conf
from yolo_glance import glance as glance_api
from yolo_glance import service

GLANCE_HOST, GLANCE_PORT = 'glance.test', 9292
BUILD_TIMEOUT = 900
GLANCE_TEST_ETC = pathlib.Path(glance.__file__).parent / 'tests' / 'etc'


def dechunk(stream):
    """The body of a chunked request, as a WSGI server hands it to the application (glance-api
    runs under uWSGI or Apache, which do this; wsgi_intercept does not)."""
    body = io.BytesIO()
    while True:
        size = int(stream.readline().split(b';')[0], 16)
        if size == 0:
            return body.getvalue()
        body.write(stream.read(size))
        stream.readline()


def as_admin(app, project_id):
    """What keystonemiddleware's auth_token leaves in the environ for a valid admin token, on a
    body the WSGI server has de-chunked."""
    def authenticated(environ, start_response):
        if environ.get('HTTP_TRANSFER_ENCODING', '').lower() == 'chunked':
            body = dechunk(environ['wsgi.input'])
            environ.pop('HTTP_TRANSFER_ENCODING')
            environ['wsgi.input'] = io.BytesIO(body)
            environ['CONTENT_LENGTH'] = str(len(body))
        environ.update({'HTTP_X_IDENTITY_STATUS': 'Confirmed', 'HTTP_X_ROLES': 'admin,member',
                        'HTTP_X_USER_ID': 'yolo-worker', 'HTTP_X_TENANT_ID': project_id,
                        'HTTP_X_PROJECT_ID': project_id, 'HTTP_X_AUTH_TOKEN': 'token'})
        return app(environ, start_response)
    return authenticated


class GlanceWorkerTest(functional.SynchronousAPIBase):

    def copy_data_file(self, file_name, dst_dir):
        # The base classes find Glance's test data relative to the working directory.
        shutil.copy(GLANCE_TEST_ETC / file_name, dst_dir)
        return os.path.join(dst_dir, file_name)

    _copy_data_file = copy_data_file

    @pytest.fixture(autouse=True)
    def bootable_image(self, tiny_image):
        self.test_image = tiny_image

    def setUp(self):
        super().setUp()
        self.config(container_formats=['bare', 'ovf', 'ova', 'aki', 'ari', 'ami', 'docker',
                                       'compressed', 'yolo'], group='image_format')
        self.config(image_import_plugins=['yolo_boot_image'], group='image_import_opts')
        self.config(enabled_import_methods=['glance-direct'])

        # One in-memory transport for Glance's notifier and the worker's listener.
        messaging = cfg.ConfigOpts()
        for group, opts in messaging_opts.list_opts():
            messaging.register_opts(opts, group=group)
        messaging([], project='yolo-test')
        messaging.set_override('driver', ['messagingv2'], group='oslo_messaging_notifications')
        # glance-api sends on the worker's own topic, as yolo-configure sets it up.
        messaging.set_override('topics', [configure.NOTIFICATION_TOPIC],
                               group='oslo_messaging_notifications')
        messaging.set_override('control_exchange', 'glance')
        self.transport = oslo_messaging.get_notification_transport(messaging, url='fake:/')
        self.useFixture(fixtures.MockPatch('glance.notifier.get_transport',
                                           return_value=self.transport))
        self.start_server(enable_cache=False)

        requests_intercept.install()
        self.addCleanup(requests_intercept.uninstall)
        wsgi_intercept.add_wsgi_intercept(GLANCE_HOST, GLANCE_PORT,
                                          lambda: as_admin(self.api, self.TENANT))
        self.addCleanup(wsgi_intercept.remove_wsgi_intercept, GLANCE_HOST, GLANCE_PORT)

        worker_conf = cfg.ConfigOpts()
        yolo_conf.register_opts(worker_conf)
        worker_conf([], project='yolo-test')
        worker_conf.set_override('auth_type', 'none', group='glance')
        worker_conf.set_override('endpoint_override', 'http://%s:%d' % (GLANCE_HOST, GLANCE_PORT),
                                 group='glance')
        worker_conf.set_override('work_dir', os.path.join(self.test_dir, 'work'),
                                 group='yolo_worker')
        worker_conf.set_override('yolofs_binary', yolofs.binary(), group='yolo_worker')
        worker_conf.set_override('retries', 0, group='yolo_worker')
        worker_conf.set_override('idle_seconds', 600, group='yolo_profiling')
        worker_conf.set_override('max_seconds', BUILD_TIMEOUT, group='yolo_profiling')
        worker_conf.set_override('memory_mib', 512, group='yolo_profiling')
        self.signer = signing.Signer.create(os.path.join(self.test_dir, 'signing.key'))
        worker_conf.set_override('signing_key_file', os.path.join(self.test_dir, 'signing.key'),
                                 group='yolo_worker')
        self.glance = glance_api.Glance.from_conf(worker_conf)
        self.dispatcher = service.make_dispatcher(worker_conf, self.glance)
        self.addCleanup(self.dispatcher.shutdown)
        self.listener = service.notification_listener(worker_conf, self.dispatcher,
                                                      transport=self.transport)
        self.listener.start()
        self.addCleanup(self.listener.wait)
        self.addCleanup(self.listener.stop)

    # -- helpers ---------------------------------------------------------------------------

    @property
    def client(self):
        return self.glance.client

    # The test's Glance keeps its database in SQLite, which refuses a write that races another
    # ("database is locked") where a deployment's MySQL would wait: the worker writing statuses
    # can collide with an upload, and the image is left half-saved. The upload is made again as
    # a new image (the stuck one never becomes active, so the worker never sees it).
    @tenacity.retry(retry=tenacity.retry_if_exception_type(glance_exc.HTTPInternalServerError),
                    stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_fixed(1),
                    reraise=True)
    def upload(self, path, disk_format='qcow2', container_format='bare', **properties):
        """``openstack image create --file PATH --disk-format F --container-format C``."""
        image = self.client.images.create(name='test-%s' % uuid.uuid4().hex[:6],
                                          disk_format=disk_format,
                                          container_format=container_format,
                                          visibility='private', **properties)
        with open(path, 'rb') as data:
            self.client.images.upload(image['id'], data)
        return image['id']

    def wait_for_status(self, image_id, wanted, timeout=BUILD_TIMEOUT):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            image = self.glance.get(image_id)
            if image.get(glance_api.STATUS) in wanted:
                return image
            time.sleep(1)
        self.fail('%s: %s not reached in %ss; image: %s' % (
            image_id, wanted, timeout, self.glance.get(image_id)))

    def assert_published_and_verified(self, image_id, test_image):
        image = self.wait_for_status(image_id, ('ready', 'failed'))
        self.assertEqual('ready', image[glance_api.STATUS], image.get(glance_api.REASON))
        boot_image = self.glance.get(image[glance_api.BOOT_IMAGE_ID])
        self.assertTrue(boot_image['os_hidden'])
        self.assertEqual('yolo', boot_image['container_format'])
        self.assertEqual(image_id, boot_image[glance_api.SOURCE_IMAGE_ID])
        self.assertEqual('ready', boot_image['yolo_window_ended_by'])
        self.assertLess(float(boot_image['yolo_coverage']), 0.25)
        # It verifies against the raw conversion of the image, as a compute node checks it.
        raw = pathlib.Path(self.test_dir) / 'check.raw'
        images.convert_to_raw(test_image, raw)
        downloaded = pathlib.Path(self.test_dir) / 'downloaded.yolo'
        self.glance.download(boot_image['id'], downloaded)
        yolofs.run('verify', downloaded, raw)
        raw.unlink()
        # Signed with the worker's key, over the data Glance serves.
        self.assertTrue(self.signer.verifier().verify(
            boot_image[contract.SIGNATURE], image_id, boot_image['os_hash_algo'],
            signing.file_digest(downloaded, boot_image['os_hash_algo'])))
        return image, boot_image


class TestUploadAndImport(GlanceWorkerTest):

    def test_upload_then_import_get_boot_images_and_deletion_removes_them(self):
        test_image = self.test_image

        # Plain upload (PUT .../file): only the notifications reach the worker.
        uploaded = self.upload(test_image)
        image, boot_image = self.assert_published_and_verified(uploaded, test_image)
        self.assertEqual('active', image['status'])
        self.assertEqual(self.TENANT, boot_image['owner'])

        # Import workflow with the plugin: marked pending during the import, then built.
        imported = self.client.images.create(name='imported', disk_format='qcow2',
                                             container_format='bare')['id']
        with open(test_image, 'rb') as data:
            self.client.images.stage(imported, data)
        self.client.images.image_import(imported, method='glance-direct')
        statuses = []
        deadline = time.monotonic() + BUILD_TIMEOUT
        while time.monotonic() < deadline:
            status = self.glance.get(imported).get(glance_api.STATUS)
            statuses.append(status)
            if status in ('ready', 'failed'):
                break
            time.sleep(0.2)
        self.assert_published_and_verified(imported, test_image)
        # The plugin marked it during the import, before the worker took it.
        self.assertIn('pending', statuses)

        # image.delete removes the boot image.
        self.client.images.delete(uploaded)
        deadline = time.monotonic() + 60
        while self.glance.boot_images_of(uploaded, 'yolo') and time.monotonic() < deadline:
            time.sleep(0.5)
        self.assertEqual([], self.glance.boot_images_of(uploaded, 'yolo'))
        self.assertEqual(1, len(self.glance.boot_images_of(imported, 'yolo')))


class TestScan(GlanceWorkerTest):

    def test_scan_builds_images_uploaded_while_the_worker_was_not_listening(self):
        self.listener.stop()
        self.listener.wait()
        image_id = self.upload(self.test_image)
        time.sleep(2)
        self.assertNotIn(glance_api.STATUS, self.glance.get(image_id))
        self.assertEqual([image_id], self.dispatcher.scan())
        self.assert_published_and_verified(image_id, self.test_image)
        self.assertEqual([], self.dispatcher.scan())


class TestBadInput(GlanceWorkerTest):

    def test_corrupt_unbootable_and_skipped_images_get_a_clear_status(self):
        scratch = pathlib.Path(self.test_dir)
        # A truncated upload: still looks like qcow2, so Glance accepts it.
        corrupt = scratch / 'truncated.qcow2'
        corrupt.write_bytes(self.test_image.read_bytes()[:self.test_image.stat().st_size // 2])
        corrupt_id = self.upload(corrupt)
        # A kernel image: skipped.
        kernel = self.upload(corrupt, disk_format='aki', container_format='aki')
        # A disk that boots nothing: the BIOS reads its first sector and gives up.
        blank = scratch / 'blank.raw'
        subprocess.run(['truncate', '-s', '64M', str(blank)], check=True)
        blank_id = self.upload(blank, disk_format='raw', yolo_idle_seconds='5',
                               yolo_max_seconds='60')
        # Data that is not what the image says: Glance refuses it and the image never becomes
        # active, so the worker has nothing to do with it.
        garbage = scratch / 'garbage'
        garbage.write_bytes(os.urandom(1 << 20))
        refused = self.client.images.create(name='garbage', disk_format='qcow2',
                                            container_format='bare')['id']
        with open(garbage, 'rb') as data:
            self.assertRaises(glance_exc.HTTPException, self.client.images.upload, refused,
                              data)

        corrupt_image = self.wait_for_status(corrupt_id, ('failed', 'ready'))
        self.assertEqual('failed', corrupt_image[glance_api.STATUS])
        self.assertIn('could not be converted to raw', corrupt_image[glance_api.REASON])
        skipped = self.wait_for_status(kernel, ('skipped', 'failed', 'ready'))
        self.assertEqual('skipped', skipped[glance_api.STATUS])
        self.assertEqual('kernel or ramdisk image', skipped[glance_api.REASON])
        blank_image = self.wait_for_status(blank_id, ('failed', 'ready'))
        self.assertEqual('failed', blank_image[glance_api.STATUS])
        self.assertIn('did not boot', blank_image[glance_api.REASON])

        # Nothing else touched: the images are active, with their data, and nothing published.
        for image_id, path in ((corrupt_id, corrupt), (blank_id, blank)):
            image = self.glance.get(image_id)
            self.assertEqual('active', image['status'])
            downloaded = scratch / 'check'
            self.glance.download(image_id, downloaded)
            self.assertEqual(path.read_bytes(), downloaded.read_bytes())
            self.assertEqual([], self.glance.boot_images_of(image_id, 'yolo'))
        refused_image = self.glance.get(refused)
        self.assertNotEqual('active', refused_image['status'])
        self.assertNotIn(glance_api.STATUS, refused_image)

    def test_image_deleted_mid_build(self):
        test_image = self.test_image
        image_id = self.upload(test_image)
        self.wait_for_status(image_id, ('building',), timeout=120)
        self.client.images.delete(image_id)
        deadline = time.monotonic() + BUILD_TIMEOUT
        while self.dispatcher.in_flight and time.monotonic() < deadline:
            time.sleep(1)
        self.assertEqual({}, self.dispatcher.in_flight)
        self.assertEqual([], self.glance.boot_images_of(image_id, 'yolo'))
        self.assertEqual([], [i for i in self.glance.active_images()
                              if i.get(glance_api.SOURCE_IMAGE_ID) == image_id])
