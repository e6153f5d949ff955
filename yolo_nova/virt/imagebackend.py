"""Nova's image backends with YOLO's qcow2: root disks backed by the yolofs mirror of ``_base``.

Nova has no registry of image backends, so the driver replaces its ``Backend`` with this one.
"""

import os

from nova.virt.libvirt import imagebackend


class YoloQcow2(imagebackend.Qcow2):
    """Qcow2 that, once Nova has created a disk over a base file, fetches the image's boot image
    and points the disk's backing file at the yolofs mount (when yolofs is healthy).

    ``backing_files`` and ``boot_images`` are set on the per-driver subclass made by
    :class:`YoloBackend`.
    """
    backing_files = None
    boot_images = None

    def create_image(self, prepare_template, base, size, safe=False, *args, **kwargs):
        super().create_image(prepare_template, base, size, safe, *args, **kwargs)
        name = os.path.basename(base)
        if not self.backing_files.is_image_base(name):
            return
        context, image_id = kwargs.get('context'), kwargs.get('image_id')
        if context is not None and image_id:
            self.boot_images.ensure(context, image_id, base)
        self.backing_files.place(self.path)

    def resize_image(self, size):
        with self.backing_files.on_base(self.path):
            super().resize_image(size)

    def snapshot_extract(self, target, out_format):
        with self.backing_files.on_base(self.path):
            super().snapshot_extract(target, out_format)


class YoloBackend(imagebackend.Backend):
    def __init__(self, use_cow, backing_files, boot_images):
        super().__init__(use_cow)
        qcow2 = type('YoloQcow2', (YoloQcow2,), {'backing_files': backing_files,
                                                 'boot_images': boot_images})
        for image_type, backend in self.BACKEND.items():
            if backend is imagebackend.Qcow2:
                self.BACKEND[image_type] = qcow2
