"""An in-memory Glance and a profiling boot that always reads the same, for the worker's tests."""

import copy
import hashlib
import itertools
import pathlib
import shutil

from yolo_common import contract
from yolo_common import learning
from yolo_glance import glance as glance_api

MiB = 1 << 20


class FakeGlance:
    """The part of the Glance API the worker uses, in memory."""

    def __init__(self, root):
        self.root = pathlib.Path(root)
        self.images = {}
        self.ids = itertools.count(1)
        self.downloads = 0
        self.fail_downloads = 0

    def add(self, data=None, **fields):
        image_id = 'img-%d' % next(self.ids)
        image = {'id': image_id, 'status': 'active', 'disk_format': 'raw',
                 'container_format': 'bare', 'created_at': '2026-11-21T00:00:%02d' % len(
                     self.images), 'owner': 'p1',
                 'size': None if data is None else len(data), **fields}
        if data is not None:
            # Glance's own digest of the data it stored (its default hashing_algorithm).
            image.setdefault('os_hash_algo', 'sha512')
            image.setdefault('os_hash_value', hashlib.sha512(data).hexdigest())
            path = self.root / image_id
            path.write_bytes(data)
            image['file'] = path
        self.images[image_id] = image
        return image_id

    def get(self, image_id):
        if image_id not in self.images:
            raise glance_api.NotFound()
        return copy.deepcopy(self.images[image_id])

    def active_images(self):
        return [copy.deepcopy(i) for i in self.images.values() if i['status'] == 'active']

    def boot_images(self, container_format):
        return [copy.deepcopy(i) for i in self.images.values()
                if i['container_format'] == container_format]

    def boot_images_of(self, source_id, container_format):
        return [copy.deepcopy(i) for i in self.images.values()
                if i.get(glance_api.SOURCE_IMAGE_ID) == source_id
                and i['container_format'] == container_format]

    def download(self, image_id, path):
        self.downloads += 1
        if self.fail_downloads:
            self.fail_downloads -= 1
            raise OSError('connection reset')
        shutil.copyfile(self.get(image_id)['file'], path)
        return pathlib.Path(path).stat().st_size

    def set_properties(self, image_id, remove=(), **properties):
        image = self.images.get(image_id)
        if image is None:
            raise glance_api.NotFound()
        for key in remove:
            image.pop(key, None)
        image.update(properties)

    def publish(self, source, path, container_format, properties):
        data = pathlib.Path(path).read_bytes()
        return self.add(data, container_format=container_format, os_hidden=True,
                        **{glance_api.SOURCE_IMAGE_ID: source['id']}, **properties)

    def delete(self, image_id):
        self.images.pop(image_id, None)


def raw_disk(size=4 * MiB):
    return b''.join(('block %d;' % i).encode().ljust(4096, b'.') for i in range(size // 4096))


def fake_learner(reads=((0, 65536), (MiB, 8192))):
    """Stands in for the profiling boot: the same trace every time."""
    calls = []

    def learn(base, work, **options):
        calls.append(options)
        work = pathlib.Path(work)
        work.mkdir(parents=True)
        trace = work / 'boot.trace'
        trace.write_text(''.join('%d %d\n' % r for r in reads))
        return learning.Learned(trace, None, 12.5, 0.1, 'ready')
    learn.calls = calls
    return learn


def publish_signed(glance, signer, source, data=b'other', **fields):
    """A boot image of ``source`` as another worker with the same key publishes it."""
    boot_image = glance.add(data, container_format='yolo', os_hidden=True,
                            **{glance_api.SOURCE_IMAGE_ID: source}, **fields)
    glance.set_properties(boot_image, **{contract.SIGNATURE: signer.sign(
        source, 'sha512', hashlib.sha512(data).hexdigest())})
    return boot_image
