"""Boot images on a compute node: fetched from Glance, handed to yolofs, which verifies them.

A published boot image (the image property ``yolo_boot_image_id``) is untrusted input: anyone
who can upload an image can publish one. The driver downloads it into a directory of its own
(``[yolo] download_dir``) and asks yolofs to install it over the control socket: yolofs, which
runs as root and is the only writer of its boot image store, compares every extent with the local
base file and installs nothing that does not match. The driver never reads or writes the store.
Any failure here is logged and leaves the image without a boot image; it never fails a boot, and
while yolofs is not healthy nothing is attempted.
"""

import os
import tempfile

from oslo_log import log as logging

from yolo_common import yolofs

LOG = logging.getLogger(__name__)

BOOT_IMAGE_PROPERTY = 'yolo_boot_image_id'


class BootImages:
    """This host's boot images, as yolofs (through ``backing_files``' client) reports them."""

    def __init__(self, backing_files, download_dir, fetch=True, image_api=None,
                 install_timeout=120.0):
        self.backing_files = backing_files
        self.download_dir = download_dir
        self.fetch = fetch
        self.install_timeout = install_timeout
        self._image_api = image_api

    @property
    def image_api(self):
        if self._image_api is None:
            from nova.image import glance
            self._image_api = glance.API()
        return self._image_api

    @property
    def client(self):
        return self.backing_files.client

    def ensure(self, context, image_id, base_path):
        """Makes sure yolofs has the base file's boot image if Glance publishes one.

        Returns what happened: 'unavailable' (yolofs is not healthy: nothing attempted),
        'present', 'none' (no boot image published: yolofs learns one from the first boot if it
        runs with --learn), 'installed', 'rejected' (yolofs refused it) or 'failed'.
        """
        name = os.path.basename(base_path)
        status = self.backing_files.status()
        if status is None:
            LOG.debug('yolofs is not healthy: no boot image for %s', name)
            return 'unavailable'
        try:
            # Base file names are sha1(image id): yolofs cannot know the image otherwise, and a
            # boot image it learns from the coming boot is attributed to it.
            self.client.remember(name, image_id)
            present = yolofs.boot_images(status).get(name)
            if present and not present.get('rejected'):
                return 'present'
            if not self.fetch:
                return 'none'
            image = self.image_api.get(context, image_id)
            boot_image_id = (image.get('properties') or {}).get(BOOT_IMAGE_PROPERTY)
            if not boot_image_id:
                LOG.debug('Image %s has no published boot image', image_id)
                return 'none'
            return self._install(context, name, image_id, boot_image_id)
        except Exception:
            # A boot image only makes boots faster; nothing about it may stop one.
            LOG.exception('Could not get the boot image of image %s to yolofs', image_id)
            return 'failed'

    def _install(self, context, name, image_id, boot_image_id):
        os.makedirs(self.download_dir, mode=0o755, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix=name + '.', suffix='.yolo', dir=self.download_dir)
        os.close(fd)
        try:
            LOG.info('Downloading boot image %s for base file %s', boot_image_id, name)
            self.image_api.download(context, boot_image_id, dest_path=path)
            # yolofs runs as root and reads it (root could anyway); it must stay our own file.
            os.chmod(path, 0o644)
            try:
                installed = self.client.install(name, path, image_id,
                                                timeout=self.install_timeout)
            except yolofs.YolofsError as e:
                LOG.warning('yolofs did not install boot image %s for base file %s: %s',
                            boot_image_id, name, e)
                return 'rejected'
            LOG.info('Installed verified boot image %s for base file %s (yolofs: %s)',
                     boot_image_id, name, installed)
            return 'installed'
        finally:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def verified_image_ids(self, status=None):
        """Glance image ids yolofs serves a verified, unrefused boot image for (``status``: an
        answer already fetched)."""
        if status is None:
            status = self.backing_files.status()
        return yolofs.served_image_ids(status)

    def has_boot_image(self, name, status):
        """Whether yolofs (whose ``status`` answer this is) has a usable boot image for ``name``."""
        entry = yolofs.boot_images(status).get(name)
        return bool(entry) and not entry.get('rejected')

    def prune(self):
        """Asks yolofs to delete the boot images of base files the image cache manager removed."""
        if self.backing_files.status() is None:
            return []
        try:
            removed = self.client.prune()
        except (OSError, ValueError, yolofs.YolofsError) as e:
            LOG.warning('yolofs could not prune its boot image store: %s', e)
            return []
        if removed:
            LOG.info('yolofs removed the boot image files of deleted base files: %s',
                     ', '.join(removed))
        return removed
