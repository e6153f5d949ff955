"""Boot images on a compute node: fetched from Glance, verified here, installed in yolofs' store.

A published boot image (the image property ``yolo_boot_image_id``) is untrusted input: anyone
who can upload an image can publish one. It is installed only after ``yolofs verify`` has compared
every extent with the local base file, and yolofs itself serves nothing it has not verified. Any
failure here is logged and leaves the image without a boot image; it never fails a boot.
"""

import os
import shutil
import subprocess
import uuid

from oslo_log import log as logging

LOG = logging.getLogger(__name__)

BOOT_IMAGE_PROPERTY = 'yolo_boot_image_id'
SUFFIX = '.yolo'
STAMP_SUFFIX = SUFFIX + '.verified'
# The Glance image id of a base file, next to its boot image: base file names are
# sha1(image id), which cannot be reversed, and the scheduler asks by image id.
IMAGE_ID_SUFFIX = '.image-id'
# Every file the store may hold for one base file (the trace is what yolofs learned from).
STORE_SUFFIXES = (SUFFIX, STAMP_SUFFIX, IMAGE_ID_SUFFIX, '.trace')


class BootImages:
    """The boot image store of this host (``[yolo] boot_image_dir``)."""

    def __init__(self, store_dir, yolofs_binary='yolofs', fetch=True, image_api=None):
        self.store_dir = store_dir
        self.yolofs_binary = yolofs_binary
        self.fetch = fetch
        self._image_api = image_api

    @property
    def image_api(self):
        if self._image_api is None:
            from nova.image import glance
            self._image_api = glance.API()
        return self._image_api

    def path_for(self, name):
        return os.path.join(self.store_dir, name + SUFFIX)

    def remember_image_id(self, name, image_id):
        path = os.path.join(self.store_dir, name + IMAGE_ID_SUFFIX)
        if os.path.exists(path):
            return
        os.makedirs(self.store_dir, exist_ok=True)
        tmp = '%s.%s.tmp' % (path, uuid.uuid4().hex)
        with open(tmp, 'w') as f:
            f.write(image_id)
        os.replace(tmp, path)

    def ensure(self, context, image_id, base_path):
        """Makes sure the base file's boot image is in the store if Glance publishes one.

        Returns what happened: 'present', 'none' (no boot image published: yolofs learns one
        from the first boot if it runs with --learn), 'installed', 'rejected' or 'failed'.
        """
        name = os.path.basename(base_path)
        try:
            self.remember_image_id(name, image_id)
            if os.path.exists(self.path_for(name)):
                return 'present'
            if not self.fetch:
                return 'none'
            image = self.image_api.get(context, image_id)
            boot_image_id = (image.get('properties') or {}).get(BOOT_IMAGE_PROPERTY)
            if not boot_image_id:
                LOG.debug('Image %s has no published boot image', image_id)
                return 'none'
            return self._install(context, name, boot_image_id, base_path)
        except Exception:
            # A boot image only makes boots faster; nothing about it may stop one.
            LOG.exception('Could not fetch the boot image of image %s', image_id)
            return 'failed'

    def _install(self, context, name, boot_image_id, base_path):
        incoming_dir = os.path.join(self.store_dir, '.incoming')
        os.makedirs(incoming_dir, exist_ok=True)
        incoming = os.path.join(incoming_dir, '%s%s.%s' % (name, SUFFIX, uuid.uuid4().hex))
        try:
            LOG.info('Downloading boot image %s for base file %s', boot_image_id, name)
            self.image_api.download(context, boot_image_id, dest_path=incoming)
            # --mark writes the stamp yolofs trusts instead of verifying again; the base file was
            # just downloaded, so it is still in page cache and this is cheap.
            proc = subprocess.run(
                [yolofs_command(self.yolofs_binary), 'verify', '--mark', incoming, base_path],
                capture_output=True, text=True)
            if proc.returncode != 0:
                LOG.warning('Boot image %s does not match base file %s; not installed: %s',
                            boot_image_id, name, (proc.stderr or proc.stdout).strip())
                return 'rejected'
            # Stamp first: yolofs finds the boot image already verified when it appears.
            os.replace(incoming + '.verified', self.path_for(name) + '.verified')
            os.replace(incoming, self.path_for(name))
            LOG.info('Installed verified boot image %s for base file %s', boot_image_id, name)
            return 'installed'
        finally:
            for leftover in (incoming, incoming + '.verified'):
                if os.path.exists(leftover):
                    os.unlink(leftover)

    def verified_image_ids(self, rejected=()):
        """Glance image ids whose boot image is in the store, verified, and not rejected."""
        ids = set()
        try:
            names = os.listdir(self.store_dir)
        except FileNotFoundError:
            return ids
        present = set(names)
        for entry in names:
            if not entry.endswith(IMAGE_ID_SUFFIX):
                continue
            name = entry[:-len(IMAGE_ID_SUFFIX)]
            if name in rejected or name + SUFFIX not in present \
                    or name + STAMP_SUFFIX not in present:
                continue
            try:
                with open(os.path.join(self.store_dir, entry)) as f:
                    ids.add(f.read().strip())
            except OSError:
                continue
        return ids

    def remove_orphans(self, base_dir):
        """Deletes store files whose base file the image cache manager removed."""
        try:
            names = os.listdir(self.store_dir)
        except FileNotFoundError:
            return []
        removed = []
        for entry in names:
            for suffix in STORE_SUFFIXES:
                if entry.endswith(suffix):
                    name = entry[:-len(suffix)]
                    if not os.path.exists(os.path.join(base_dir, name)):
                        os.unlink(os.path.join(self.store_dir, entry))
                        removed.append(entry)
                    break
        if removed:
            LOG.info('Removed boot image files of deleted base files: %s', ', '.join(removed))
        return removed


def yolofs_command(configured):
    """The yolofs binary: the configured one if it is a path or on PATH, else the repository's."""
    found = shutil.which(configured)
    if found:
        return found
    from yolo_common import yolofs
    return yolofs.binary()
