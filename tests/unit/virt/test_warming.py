"""Warming: the boot images of the images an operator chose, held before their base files, within
a budget, and used by a first boot only once their signature checks again."""

import os
import shutil
import time
from unittest import mock

import pytest

from yolo_common import contract
from yolo_common import signing
from yolo_common import yolofs
from yolo_nova.model import locality
from yolo_nova.virt import boot_images
from yolo_nova.virt import warming

IMAGE = '0b5d7c1e-8d5e-4a55-9a57-2f5cbd1c3d3e'
OTHER = '11111111-2222-4333-8444-555566667777'
MIB = 1 << 20


def store_file(store, image_id, boot_image_id, size, used):
    os.makedirs(store.directory, exist_ok=True)
    path = os.path.join(store.directory, '%s.%s.yolo' % (image_id, boot_image_id))
    with open(path, 'wb') as f:
        f.truncate(size)
    os.utime(path, (used, used))
    return path


def test_the_store_evicts_images_no_longer_warm_first_then_the_least_recently_used(tmp_path):
    store = warming.WarmStore(str(tmp_path / 'warm'), budget=3 * MIB)
    now = time.time()
    store_file(store, 'a', 'ba', MIB, now - 10)     # warm, used long ago
    store_file(store, 'b', 'bb', MIB, now)          # warm, used now
    store_file(store, 'c', 'bc', MIB, now)          # no longer warm, used now
    store_file(store, 'd', 'bd', MIB, now - 5)
    assert store.evict({'a', 'b', 'd'}) == ['c']
    assert store.held_image_ids() == {'a', 'b', 'd'}
    store.budget = MIB
    assert store.evict({'a', 'b', 'd'}) == ['a', 'd']
    assert store.held_image_ids() == {'b'}


def test_the_store_keeps_only_its_own_files(tmp_path):
    store = warming.WarmStore(str(tmp_path / 'warm'), budget=MIB)
    store_file(store, 'a', 'ba', 10, time.time())
    for stray in ('notes.txt', 'a.b.c.yolo'):
        (tmp_path / 'warm' / stray).write_text('x')
    os.symlink('/etc/passwd', tmp_path / 'warm' / 'e.be.yolo')
    (tmp_path / 'warm' / 'f.bf.yolo').mkdir()       # left, and no error
    assert store.held_image_ids() == {'a'}
    assert sorted(os.listdir(tmp_path / 'warm')) == ['a.ba.yolo', 'f.bf.yolo']


def test_room_is_made_only_from_images_no_longer_warm(tmp_path):
    store = warming.WarmStore(str(tmp_path / 'warm'), budget=3 * MIB)
    now = time.time()
    store_file(store, 'a', 'ba', MIB, now - 10)     # warm
    store_file(store, 'c', 'bc', MIB, now - 5)      # no longer warm
    assert store.make_room(MIB, {'a'}) and store.held_image_ids() == {'a', 'c'}
    assert store.make_room(2 * MIB, {'a'}) and store.held_image_ids() == {'a'}
    # A warm image's boot image is never removed for another's; nothing is removed in vain.
    store_file(store, 'c', 'bc', MIB, now - 5)
    assert not store.make_room(3 * MIB, {'a'})
    assert store.held_image_ids() == {'a', 'c'}
    # A new boot image of an image held replaces its old one: the old one's room counts.
    assert store.make_room(2 * MIB, {'a'}, image_id='a')
    assert store.held_image_ids() == {'a', 'c'}


def test_a_boot_image_is_linked_for_its_first_boot_and_marked_used(tmp_path):
    store = warming.WarmStore(str(tmp_path / 'warm'), budget=MIB)
    path = store_file(store, 'a', 'ba', 10, 1000.0)
    dest = str(tmp_path / 'fill.yolo')
    assert not store.link_for('a', 'another-boot-image', dest)
    assert store.link_for('a', 'ba', dest)
    assert os.path.samefile(dest, path) and os.stat(path).st_mtime > 1000.0
    os.unlink(dest)     # the fill's end
    assert store.held_image_ids() == {'a'}


class ServiceGlance:
    """The service identity's Glance: list by property, get and download."""
    project_id = 'service'

    def __init__(self, images):
        self.images = images
        self.client = mock.Mock()
        self.client.images.list.side_effect = lambda filters: [
            dict(i) for i in images.values()
            if all(i.get(k) == v for k, v in filters.items())]
        self.downloads = []

    def get(self, context, image_id):
        image = self.images[image_id]
        core = ('id', 'owner', 'container_format', 'status', 'size', 'os_hash_algo')
        return {**{k: image.get(k) for k in core},
                'properties': {k: v for k, v in image.items() if k not in core}}

    def download(self, context, image_id, dest_path):
        self.downloads.append(image_id)
        shutil.copyfile(self.images[image_id]['file'], dest_path)


class Files:
    """yolofs and _base as the warmer sees them."""

    def __init__(self, base_dir):
        self.base_dir = str(base_dir)
        self.client = mock.Mock()
        self.installed = {}
        self.client.install.side_effect = lambda name, path, image_id, timeout=None: (
            self.installed.__setitem__(name, image_id)
            or yolofs.Installed(name, image_id, 1, os.path.getsize(path), 0.0))

    def status(self):
        return yolofs.Status.from_answer({'boot_images': [
            {'file': n, 'image_id': i, 'verified': True} for n, i in self.installed.items()]})

    def base_path(self, name):
        return os.path.join(self.base_dir, name)


@pytest.fixture
def cloud(tmp_path):
    key = signing.Signer.generate()
    published = tmp_path / 'published.yolo'
    published.write_bytes(os.urandom(4096))
    digest = signing.file_digest(str(published), 'sha512')
    images = {}
    for image_id, boot_image_id, warm in ((IMAGE, 'boot-1', 'all'),
                                          (OTHER, 'boot-2', 'aggregate:rack-7')):
        images[image_id] = {'id': image_id, 'status': 'active', 'owner': 'tenant',
                            'container_format': 'bare', contract.WARM: warm,
                            contract.BOOT_IMAGE_ID: boot_image_id}
        images[boot_image_id] = {
            'id': boot_image_id, 'status': 'active', 'owner': 'service',
            'container_format': 'yolo', 'size': 4096, 'os_hash_algo': 'sha512',
            'file': str(published), contract.SOURCE_IMAGE_ID: image_id,
            contract.SIGNATURE: key.sign(image_id, 'sha512', digest)}
    glance = ServiceGlance(images)
    files = Files(tmp_path / '_base')
    os.makedirs(files.base_dir)
    booted = boot_images.BootImages(files, str(tmp_path / 'incoming'), boot_image_api=glance,
                                    image_api=glance, signing_keys=[key.public_key])
    booted.warm_store = warming.WarmStore(str(tmp_path / 'incoming' / 'warm'), 64 * MIB)
    warmer = warming.Warmer(booted, booted.warm_store, files, lambda: ['rack-7'], 600)
    return glance, files, booted, warmer


def test_a_host_holds_the_boot_images_of_the_images_warm_where_it_is(cloud):
    glance, files, booted, warmer = cloud
    warmer.run()
    assert warmer.warm_image_ids == {IMAGE, OTHER}
    assert booted.warm_store.held_image_ids() == {IMAGE, OTHER}
    # Not in an aggregate where OTHER is warm: only IMAGE.
    warmer.aggregates = lambda: []
    warmer.run()
    assert warmer.warm_image_ids == {IMAGE}
    assert sorted(glance.downloads) == ['boot-1', 'boot-2']     # not fetched again
    assert warmer.held_warm(files.status()) == {IMAGE}


def test_boot_images_that_do_not_fit_the_budget_are_not_fetched(cloud):
    glance, files, booted, warmer = cloud
    booted.warm_store.budget = 6000     # one boot image of 4,096 bytes
    warmer.run()
    warmer.run()
    assert len(booted.warm_store.held_image_ids()) == 1
    assert len(glance.downloads) == 1      # the other is not fetched, run after run


def test_a_cached_image_gets_its_boot_image_in_yolofs_instead(cloud):
    glance, files, booted, warmer = cloud
    name = locality.base_file_name(IMAGE)
    open(files.base_path(name), 'wb').close()
    warmer.run()
    assert files.installed == {name: IMAGE}
    assert booted.warm_store.held_image_ids() == {OTHER}
    assert warmer.held_warm(files.status()) == {IMAGE, OTHER}


def test_a_held_boot_image_stays_once_its_image_is_cached(cloud):
    glance, files, booted, warmer = cloud
    warmer.run()
    name = locality.base_file_name(IMAGE)
    open(files.base_path(name), 'wb').close()
    warmer.run()
    # In yolofs for the cached file (from the store's copy), and still held for a first boot
    # once Nova's image cache removes it: never fetched again.
    assert files.installed == {name: IMAGE}
    assert booted.warm_store.held_image_ids() == {IMAGE, OTHER}
    os.unlink(files.base_path(name))
    warmer.run()
    assert booted.warm_store.held_image_ids() == {IMAGE, OTHER}
    assert sorted(glance.downloads) == ['boot-1', 'boot-2']


def test_a_held_copy_of_a_cached_image_goes_once_another_is_published_or_refused(cloud):
    glance, files, booted, warmer = cloud
    warmer.run()
    open(files.base_path(locality.base_file_name(IMAGE)), 'wb').close()
    glance.images['boot-3'] = dict(glance.images['boot-1'], id='boot-3')
    glance.images[IMAGE][contract.BOOT_IMAGE_ID] = 'boot-3'
    warmer.run()
    assert booted.warm_store.held_image_ids() == {OTHER}
    # Uncached, a boot image no longer trusted (another project's, say) is not kept either.
    glance.images['boot-2']['owner'] = 'a-tenant'
    warmer.run()
    assert booted.warm_store.held_image_ids() == set()


def test_copies_of_cached_images_give_way_to_the_boot_images_of_others(cloud):
    glance, files, booted, warmer = cloud
    booted.warm_store.budget = 6000     # one boot image of 4,096 bytes
    warmer.aggregates = lambda: []      # IMAGE warm here, OTHER not yet
    warmer.run()
    assert booted.warm_store.held_image_ids() == {IMAGE}
    open(files.base_path(locality.base_file_name(IMAGE)), 'wb').close()
    warmer.aggregates = lambda: ['rack-7']
    warmer.run()
    assert booted.warm_store.held_image_ids() == {OTHER}


def test_no_boot_image_is_held_that_a_first_boot_could_not_use(cloud):
    glance, files, booted, warmer = cloud
    warmer.before_download = False
    warmer.run()
    assert booted.warm_store.held_image_ids() == set() and glance.downloads == []
    # Nor an untrusted one: another project's, say.
    warmer.before_download = True
    glance.images['boot-1']['owner'] = 'a-tenant'
    warmer.run()
    assert booted.warm_store.held_image_ids() == {OTHER}


def test_a_first_boot_takes_the_held_boot_image_once_its_signature_checks(cloud):
    glance, files, booted, warmer = cloud
    warmer.run()
    name = locality.base_file_name(IMAGE)
    boot_image = glance.get(None, 'boot-1')
    path = booted.download(None, name, boot_image, IMAGE)
    assert glance.downloads.count('boot-1') == 1    # the warm one, not a new download
    os.unlink(path)
    # A held file changed since: no longer held, and Glance's copy, which checks, is used.
    held = os.path.join(booted.warm_store.directory, '%s.boot-1.yolo' % IMAGE)
    with open(held, 'r+b') as f:
        f.write(b'tampered')
    path = booted.download(None, name, boot_image, IMAGE)
    assert glance.downloads.count('boot-1') == 2
    assert open(path, 'rb').read() == open(glance.images['boot-1']['file'], 'rb').read()
    assert IMAGE not in booted.warm_store.held_image_ids()
    # Glance's own copy that does not check is refused, as any download.
    with open(glance.images['boot-1']['file'], 'r+b') as f:
        f.write(b'tampered')
    with pytest.raises(boot_images.Untrusted):
        booted.download(None, name, boot_image, IMAGE)


def test_a_listing_that_fails_changes_nothing(cloud):
    glance, files, booted, warmer = cloud
    warmer.run()
    glance.client.images.list.side_effect = OSError('Glance is away')
    warmer.run()
    assert warmer.warm_image_ids == {IMAGE, OTHER}
    assert booted.warm_store.held_image_ids() == {IMAGE, OTHER}


def test_the_trait_names_the_image():
    assert warming.warm_trait(IMAGE) == 'CUSTOM_YOLO_WARM_' + IMAGE.replace('-', '').upper()
    assert len(warming.warm_trait(IMAGE)) <= 255
