"""What the worker asks of Glance, over python-glanceclient (image API v2)."""

import logging
import time

import glanceclient
from glanceclient import exc as glance_exc
from keystoneauth1 import exceptions as ks_exc
from keystoneauth1 import loading as ks_loading
import tenacity

from yolo_common import contract
from yolo_glance import conf as yolo_conf

LOG = logging.getLogger(__name__)

BOOT_IMAGE_ID = contract.BOOT_IMAGE_ID
STATUS = contract.STATUS
REASON = contract.REASON
CLAIM = contract.CLAIM
SOURCE_IMAGE_ID = contract.SOURCE_IMAGE_ID

NotFound = glance_exc.HTTPNotFound
# Glance busy, restarting or briefly unreachable: worth a few quick retries of one API call
# before a build counts the call as failed.
TRANSIENT = (glance_exc.HTTPInternalServerError, glance_exc.HTTPBadGateway,
             glance_exc.HTTPServiceUnavailable, glance_exc.CommunicationError,
             ks_exc.ConnectionError)
retry_transient = tenacity.retry(
    retry=tenacity.retry_if_exception_type(TRANSIENT), stop=tenacity.stop_after_attempt(5),
    wait=tenacity.wait_exponential(multiplier=0.5, max=8), reraise=True,
    before_sleep=tenacity.before_sleep_log(LOG, logging.WARNING))


class Glance:
    """Images by id, as plain dicts (properties are top-level keys, as in the v2 API)."""

    def __init__(self, client, session=None):
        self.client = client
        self._session = session

    @property
    def project_id(self):
        """The worker's own project, which owns every boot image it publishes (None without
        Keystone, as in tests against Glance's in-process API)."""
        return self._session.get_project_id() if self._session is not None else None

    @classmethod
    def from_conf(cls, conf):
        auth = ks_loading.load_auth_from_conf_options(conf, yolo_conf.GLANCE_GROUP)
        session = ks_loading.load_session_from_conf_options(
            conf, yolo_conf.GLANCE_GROUP, auth=auth)
        group = conf[yolo_conf.GLANCE_GROUP]
        return cls(glanceclient.Client('2', session=session,
                                       endpoint_override=group.endpoint_override,
                                       region_name=group.region_name,
                                       interface=(group.valid_interfaces or ['public'])[0]),
                   session=session)

    @retry_transient
    def get(self, image_id):
        return dict(self.client.images.get(image_id))

    def active_images(self):
        """Every active image of every project, hidden ones included (an admin's view)."""
        for hidden in (False, True):
            for image in self.client.images.list(
                    filters={'status': 'active', 'visibility': 'all', 'os_hidden': hidden}):
                yield dict(image)

    def boot_images(self, container_format, **filters):
        """The boot images of the worker's project (``filters``: Glance's list filters), hidden
        or not: the worker publishes hidden ones, anything else of its project is a plant."""
        filters['container_format'] = container_format
        if self.project_id:
            filters['owner'] = self.project_id
        return [dict(i) for hidden in (True, False)
                for i in self.client.images.list(filters=dict(filters, os_hidden=hidden))]

    @retry_transient
    def boot_images_of(self, source_image_id, container_format):
        """The boot images of the worker's project for an image. Anyone can upload an image
        that names a source image: only the worker's own are ever adopted."""
        return self.boot_images(container_format, **{SOURCE_IMAGE_ID: source_image_id})

    def download(self, image_id, path, progress_interval=30.0):
        """Writes the image's data to ``path``, logging progress of long downloads; glanceclient
        verifies the checksum (os_hash_value) as it streams."""
        data = self.client.images.data(image_id)
        done, last_log = 0, time.monotonic()
        with open(path, 'wb') as out:
            for chunk in data:
                out.write(chunk)
                done += len(chunk)
                if time.monotonic() - last_log > progress_interval:
                    LOG.info('%s: downloaded %d MiB', image_id, done >> 20)
                    last_log = time.monotonic()
        return done

    @retry_transient
    def set_properties(self, image_id, remove=(), **properties):
        present = self.get(image_id)
        self.client.images.update(image_id, remove_props=[p for p in remove if p in present],
                                  **properties)

    def publish(self, source, path, container_format, properties):
        """Uploads ``path`` as a hidden, private image of the worker's own project; returns its
        id. Compute nodes fetch it with their service identity, whatever project boots the
        source image; tenants never see it."""
        image = self.client.images.create(
            name='yolo-boot-image-%s' % source['id'], disk_format='raw',
            container_format=container_format, visibility='private', os_hidden=True,
            **{SOURCE_IMAGE_ID: source['id']}, **properties)
        try:
            with open(path, 'rb') as data:
                self.client.images.upload(image['id'], data)
        except Exception:
            self.delete(image['id'])
            raise
        return image['id']

    @retry_transient
    def delete(self, image_id):
        try:
            self.client.images.delete(image_id)
        except NotFound:
            pass
