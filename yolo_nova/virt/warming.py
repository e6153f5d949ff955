"""Hosts warmed before the first request: the boot images of chosen images, held without their
base files (docs/operations.md, "Warming hosts before the first request").

An operator chooses images and where they are warm (``openstack yolo image warm``): the Glance
property ``yolo_warm`` of each says ``all`` (every host) or ``aggregate:UUID`` (the hosts of a
host aggregate); only admins and services set ``yolo_*`` properties. Every ``[yolo]
warm_interval`` seconds each host asks Glance for the images warm where it is, as its service
identity, and for each one it lacks:

* with the base file cached, the boot image is installed in yolofs, as after any download (a
  copy already in the warm store stays there, for when Nova's image cache removes the file);
* without it, the published boot image (trusted as any: boot_images.untrusted) is downloaded
  into the warm store, a directory of the driver's (``warm`` in ``[yolo] download_dir``): a
  first boot of the image then starts from it with nothing to fetch, and its signature is
  checked again over its bytes at that moment (a copy changed since is removed and the boot
  image downloaded again: boot_images.BootImages.download).

The store is bounded by ``[yolo] warm_budget_mb``, checked before each download: room is made
by removing the boot images of images no longer warm, or warm but cached here, least recently
used first (a first boot counts as a use); the boot image of a warm image that is not cached is
never removed for another's, and one that does not fit is not fetched (logged). A boot image is
a few percent of its image. What the store holds is reported to the scheduler with the rest of
what the host holds (host_report), and as placement traits (``CUSTOM_YOLO_WARM_<image id>``),
which ``openstack yolo image list`` counts. With warming turned off, the driver empties the
store as it starts.
"""

import os
import random
import threading
import time

from oslo_log import log as logging
from oslo_utils import fileutils

from yolo_common import contract
from yolo_nova.model import locality

LOG = logging.getLogger(__name__)

SUFFIX = '.yolo'
EVERY_HOST = 'all'
AGGREGATE_PREFIX = 'aggregate:'


def aggregate_scope(aggregate_uuid):
    return AGGREGATE_PREFIX + aggregate_uuid


warm_trait = contract.warm_trait


class WarmStore:
    """Downloaded boot images, one file per image: ``IMAGE_ID.BOOT_IMAGE_ID.yolo``, in
    ``directory`` (the driver's), within ``budget`` bytes."""

    def __init__(self, directory, budget):
        self.directory = directory
        self.budget = budget
        self._lock = threading.Lock()

    def _entries(self):
        """{image id: (boot image id, path, size, last use)}; files not of the store are
        removed, anything else is left and logged. Never raises."""
        entries = {}
        try:
            scan = list(os.scandir(self.directory))
        except OSError:
            return entries
        for entry in scan:
            parts = entry.name.split('.')
            try:
                if entry.is_dir(follow_symlinks=False):
                    LOG.warning('%s in the warm store is a directory: left there', entry.path)
                    continue
                if not entry.is_file(follow_symlinks=False) or len(parts) != 3 \
                        or '.' + parts[2] != SUFFIX:
                    LOG.warning('Removing %s from the warm store: not one of its files',
                                entry.path)
                    os.unlink(entry.path)
                    continue
                stat = entry.stat(follow_symlinks=False)
            except OSError:
                continue    # removed meanwhile (a first boot's link, an eviction)
            entries[parts[0]] = (parts[1], entry.path, stat.st_size, stat.st_mtime)
        return entries

    def held_image_ids(self):
        return set(self._entries())

    def boot_image_id(self, image_id):
        held = self._entries().get(image_id)
        return held[0] if held else None

    def _path(self, image_id, boot_image_id):
        return os.path.join(self.directory, '%s.%s%s' % (image_id, boot_image_id, SUFFIX))

    def link_for(self, image_id, boot_image_id, dest_path):
        """Links the boot image held for ``image_id``, if it is ``boot_image_id``, at
        ``dest_path`` (replacing it), marking it used; whether it did."""
        path = self._path(image_id, boot_image_id)
        try:
            os.utime(path)
            fileutils.delete_if_exists(dest_path)
            os.link(path, dest_path)
        except FileNotFoundError:
            return False
        return True

    def add(self, image_id, boot_image_id, downloaded_path):
        """Moves ``downloaded_path`` (same file system) into the store for ``image_id``,
        replacing an older boot image of it."""
        with self._lock:
            fileutils.ensure_tree(self.directory)
            self.drop(image_id)
            os.replace(downloaded_path, self._path(image_id, boot_image_id))

    def make_room(self, size, needed_image_ids, image_id=None):
        """Whether ``size`` more bytes (a boot image of ``image_id``, replacing the one held)
        fit the budget once the boot images of images not in ``needed_image_ids`` are removed as
        needed, least recently used first (those are removed only if it then fits). Never
        removes a needed image's."""
        with self._lock:
            entries = self._entries()
            entries.pop(image_id, None)
            free = self.budget - sum(size for _, _, size, _ in entries.values())
            cold = sorted((i for i in entries if i not in needed_image_ids),
                          key=lambda i: entries[i][3])
            if size > free + sum(entries[i][2] for i in cold):
                return False
            removed = []
            for cold_id in cold:
                if size <= free:
                    break
                fileutils.delete_if_exists(entries[cold_id][1])
                free += entries[cold_id][2]
                removed.append(cold_id)
            if removed:
                LOG.info('Warm store: removed the boot images of %s, not warm or cached here, '
                         'to make room', ', '.join(removed))
            return True

    def evict(self, needed_image_ids):
        """Deletes the boot images of images not in ``needed_image_ids`` until the store is
        within its budget (a budget lowered since), least recently used first; then, if it is
        still over, the needed ones likewise. Returns the image ids removed."""
        with self._lock:
            entries = self._entries()
            total = sum(size for _, _, size, _ in entries.values())
            order = sorted(entries, key=lambda i: (i in needed_image_ids, entries[i][3]))
            removed = []
            for image_id in order:
                if total <= self.budget:
                    break
                _, path, size, _ = entries[image_id]
                fileutils.delete_if_exists(path)
                total -= size
                removed.append(image_id)
            if removed:
                LOG.info('Warm store over its %d MiB: removed the boot images of %s',
                         self.budget >> 20, ', '.join(removed))
            return removed

    def drop(self, image_id):
        held = self._entries().get(image_id)
        if held:
            fileutils.delete_if_exists(held[1])


class Warmer:
    """Keeps this host's warm store as the operator asked. ``boot_images``: the driver's
    BootImages (whose service Glance lists and downloads); ``aggregates()``: the uuids of this
    host's aggregates."""

    def __init__(self, boot_images, store, backing_files, aggregates, interval,
                 before_download=True):
        self.boot_images = boot_images
        self.store = store
        self.backing_files = backing_files
        self.aggregates = aggregates
        self.interval = interval
        # Whether first boots here start before the download: else a boot image without its
        # base file serves nothing, and only cached images are warmed.
        self.before_download = before_download
        # The first run comes at a random point of the first interval: hosts that start
        # together (a fleet restarted) do not all ask Glance at once.
        self._last = time.monotonic() - interval + random.uniform(0, interval)
        self._thread = None
        # The images warm here at the last run.
        self.warm_image_ids = frozenset()

    def maybe_run(self):
        """Starts a run in the background if the interval has passed and none is running.
        Never raises: it is called from the resource tracker's periodic task."""
        now = time.monotonic()
        if now - self._last < self.interval or (
                self._thread is not None and self._thread.is_alive()):
            return
        self._last = now
        try:
            self._thread = threading.Thread(target=self.run, name='yolo-warm', daemon=True)
            self._thread.start()
        except RuntimeError as e:
            LOG.warning('Could not start warming: %s', e)

    def held_warm(self, status):
        """The images warm here whose boot image this host holds: in the warm store, or
        verified in yolofs (``status``: its answer)."""
        held = self.store.held_image_ids() | status.served_image_ids()
        return self.warm_image_ids & held

    def scopes(self):
        return [EVERY_HOST] + [aggregate_scope(uuid) for uuid in self.aggregates()]

    def warm_images(self):
        """The images warm on this host (Glance's view, as the service identity), by id."""
        glance = self.boot_images.boot_image_api.client
        images = {}
        for scope in self.scopes():
            for image in glance.images.list(filters={contract.WARM: scope}):
                image = dict(image)
                if image.get('status') == 'active' and not contract.is_boot_image(image):
                    images[image['id']] = image
        return images

    def run(self):
        """One pass: what is warm here is held, within the budget. Never raises."""
        try:
            images = self.warm_images()
        except Exception:
            LOG.exception('Could not list the images warm on this host')
            return
        self.warm_image_ids = frozenset(images)
        # The store's copies of warm images cached here wait for Nova's image cache to remove
        # their base files: they give way to those of warm images that are not cached.
        needed = frozenset(i for i in images if not os.path.exists(
            self.backing_files.base_path(locality.base_file_name(i))))
        for image_id, image in images.items():
            try:
                self._hold(image_id, image, needed)
            except Exception:
                LOG.exception('Could not warm image %s', image_id)
        try:
            self.store.evict(needed)
        except Exception:
            LOG.exception('Could not keep the warm store within its budget')

    def _hold(self, image_id, image, needed):
        if self.backing_files.status() is None:
            return
        name = locality.base_file_name(image_id)
        # As Nova's image API gives it, which BootImages reads.
        image = dict(image, properties={k: v for k, v in image.items() if k.startswith('yolo_')})
        base_path = self.backing_files.base_path(name)
        if image_id not in needed:
            # Cached (as run() found): the boot image belongs in yolofs, which verifies it
            # against the file. A copy the store holds stays, for a first boot after Nova's image
            # cache removes the base file, if it is the one Glance publishes and yolofs did not
            # refuse it.
            outcome = self.boot_images.ensure(None, image_id, base_path, image=image)
            if outcome == 'rejected' or self.store.boot_image_id(image_id) != \
                    image['properties'].get(contract.BOOT_IMAGE_ID):
                self.store.drop(image_id)
            return
        boot_image = self.boot_images.trusted_boot_image(None, image_id, image)
        if boot_image is None:
            # None published, or refused: a copy held is of no use.
            self.store.drop(image_id)
            return
        # Served before the download only if signed by the worker (first_boot.py).
        if not self.before_download or self.boot_images.verifier is None or \
                self.store.boot_image_id(image_id) == boot_image['id']:
            return
        if not self.store.make_room(boot_image.get('size') or 0, needed, image_id):
            LOG.warning('Not holding boot image %s of image %s warm: its %d MiB do not fit the '
                        'warm store\'s %d MiB with the other warm images\' ([yolo] '
                        'warm_budget_mb)', boot_image['id'], image_id,
                        (boot_image.get('size') or 0) >> 20, self.store.budget >> 20)
            return
        path = self.boot_images.download(None, name, boot_image, image_id)
        try:
            self.store.add(image_id, boot_image['id'], path)
            LOG.info('Holding boot image %s of image %s warm', boot_image['id'], image_id)
        finally:
            fileutils.delete_if_exists(path)
