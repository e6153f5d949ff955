"""Nova's image backends with YOLO's qcow2: root disks backed by the yolofs mirror of ``_base``.

Nova has no registry of image backends, so the driver replaces its ``Backend`` with this one.
"""

import os

from nova.virt.libvirt import imagebackend
from oslo_utils import fileutils

from yolo_common import images
from yolo_nova.virt import backing


class YoloQcow2(imagebackend.Qcow2):
    """Qcow2 that, once Nova has created a disk over a base file, fetches the image's boot image
    (in the background after Nova's own download of the base file: ``BootImages.ensure``) and
    points the disk's backing file at the yolofs mount (when yolofs is healthy). With
    ``first_boots`` (``[yolo] first_boot_before_download``), a base file that is not cached is
    not waited for when its image can boot before its download (:mod:`first_boot`).

    ``backing_files``, ``boot_images`` and ``first_boots`` are set on the per-driver subclass
    made by :class:`YoloBackend`.
    """
    backing_files = None
    boot_images = None
    first_boots = None

    def create_image(self, prepare_template, base, size, safe=False, *args, **kwargs):
        if self._yolo_create_over_fill(base, size, kwargs):
            return
        downloaded_now = not os.path.exists(base)
        super().create_image(prepare_template, base, size, safe, *args, **kwargs)
        name = os.path.basename(base)
        if not self.backing_files.is_image_base(name):
            return
        context, image_id = kwargs.get('context'), kwargs.get('image_id')
        if context is not None and image_id:
            # After Nova's download, the boot image is for the boots that follow.
            self.boot_images.ensure(context, image_id, base, later=downloaded_now)
        if downloaded_now:
            self.backing_files.made(self.path, backing.AFTER_DOWNLOAD)
        self.backing_files.place(self.path)

    def _yolo_create_over_fill(self, base, size, kwargs):
        """The disk over base file ``base`` being filled, if it is not cached and its image can
        boot before its download; whether it was. Nova's checks of the base file (its size
        against the flavor's, its format) are the fill's: it begins only if the image's size fits
        ``size``, and its data is inspected as Nova inspects a download."""
        name = os.path.basename(base)
        if self.first_boots is None or os.path.exists(base) \
                or not self.backing_files.is_image_base(name):
            return False
        fill = self.first_boots.begin(kwargs.get('context'), kwargs.get('image_id'), base, size,
                                      trusted_certs=kwargs.get('trusted_certs'))
        if fill is None:
            return False
        if not os.path.exists(self.path):
            with fileutils.remove_path_on_error(self.path):
                # Not opened: a base file being filled is read only by the guest.
                images.create_overlay(self.backing_files.mount_path(name), self.path,
                                      size=max(size or 0, fill.size), open_backing=False)
        fill.add_disk(self.path)
        self.backing_files.made(self.path, backing.OVER_FILL)
        return True

    def get_disk_size(self, name):
        # Image.cache compares the flavor's size with the base file's, which may be being filled.
        fill = self.first_boots and self.first_boots.running(os.path.basename(name))
        if fill and not os.path.exists(name):
            return fill.size
        return super().get_disk_size(name)

    def resize_image(self, size):
        # Not rebased for nothing: a disk over a base file being filled is made at its size.
        if self.get_disk_size(self.path) >= size:
            return
        with self.backing_files.on_base(self.path):
            super().resize_image(size)

    def snapshot_extract(self, target, out_format):
        with self.backing_files.on_base(self.path):
            super().snapshot_extract(target, out_format)


class YoloBackend(imagebackend.Backend):
    def __init__(self, use_cow, backing_files, boot_images, first_boots=None):
        super().__init__(use_cow)
        qcow2 = type('YoloQcow2', (YoloQcow2,), {'backing_files': backing_files,
                                                 'boot_images': boot_images,
                                                 'first_boots': first_boots})
        for image_type, backend in self.BACKEND.items():
            if backend is imagebackend.Qcow2:
                self.BACKEND[image_type] = qcow2
