"""Boot images on a compute node: fetched from Glance, handed to yolofs, which verifies them.

A published boot image (the image property ``yolo_boot_image_id``) is untrusted input: anyone
who can upload an image can publish one, and tenants can set properties on their own images. The
driver fetches boot images with its service identity (``[service_user]``, whose project the
worker publishes them in: tenants never see them, whoever owns the source image) and uses only
one published by that project (``[yolo] boot_image_owner``), of container format ``yolo``, that
names the source image, that no compute host rejected and is no larger than ``[yolo]
max_boot_image_bytes``. With the worker's public keys (``[yolo] boot_image_signing_keys``) it
also needs the worker's signature over the bytes downloaded (yolo_common/signing.py): that
project also holds Nova's own service user, whose password every compute host has, and only a
signed boot image may be served before its image's download (first_boot.py). It downloads it
into a directory of its own (``[yolo] download_dir``) and asks yolofs to install it over the
control socket: yolofs, which runs as root and is the only writer of its boot image store,
compares every extent with the local base file and installs nothing that does not match. The
driver never reads or writes the store. Any failure here is logged and leaves the image without
a boot image; it never fails a boot, and while yolofs is not healthy nothing is attempted.
"""

import collections
import json
import os
import socket
import tempfile
import threading
import time

from oslo_log import log as logging
from oslo_utils import fileutils
from oslo_utils import timeutils

from yolo_common import contract
from yolo_common import signing
from yolo_common import yolofs

LOG = logging.getLogger(__name__)

# Glance's answers, and each read of a boot image's data, unless [service_user] timeout says.
READ_TIMEOUT_SECONDS = 60
# A boot image's whole download (1 GiB at most, [yolo] max_boot_image_bytes; one of 60 MiB takes
# 5 s at 100 Mbit/s): past it, the download fails.
DOWNLOAD_SECONDS = 600

BOOT_IMAGE_PROPERTY = contract.BOOT_IMAGE_ID
SOURCE_IMAGE_PROPERTY = contract.SOURCE_IMAGE_ID
CONTAINER_FORMAT = contract.CONTAINER_FORMAT
# In the download directory, beside the downloads: which boot image is installed for each
# base file.
INSTALLED_RECORD = 'installed.json'


class ServiceGlance:
    """Glance as this compute node's service identity (``[service_user]``) sees it, with the
    calls of Nova's image API that the boot images need."""

    def __init__(self, conf):
        import glanceclient
        from keystoneauth1 import loading as ks_loading
        auth = ks_loading.load_auth_from_conf_options(conf, 'service_user')
        self.session = ks_loading.load_session_from_conf_options(conf, 'service_user', auth=auth)
        if self.session.timeout is None:
            self.session.timeout = READ_TIMEOUT_SECONDS
        # Every interface [glance] valid_interfaces lists, in its order, as Nova's own image API
        # tries them: a catalogue may list only Glance's public endpoint (devstack's does).
        self.client = glanceclient.Client(
            '2', session=self.session, region_name=conf.glance.region_name,
            interface=list(conf.glance.valid_interfaces or ['internal', 'public']),
            endpoint_override=conf.glance.endpoint_override)

    @property
    def project_id(self):
        return self.session.get_project_id()

    def get(self, context, image_id):
        image = dict(self.client.images.get(image_id))
        core = ('id', 'owner', 'container_format', 'disk_format', 'status', 'size',
                'os_hash_algo', 'os_hash_value')
        return {**{k: image.get(k) for k in core},
                'properties': {k: v for k, v in image.items() if k not in core}}

    def download(self, context, image_id, dest_path):
        # glanceclient checks the data against the image's os_hash_value as it streams. A
        # stream that stalls or crawls ends the download: nothing waits on a boot image for ever.
        deadline = time.monotonic() + DOWNLOAD_SECONDS
        with open(dest_path, 'wb') as out:
            for chunk in self.client.images.data(image_id):
                out.write(chunk)
                if time.monotonic() > deadline:
                    raise TimeoutError('boot image %s: not downloaded within %d s' % (
                        image_id, DOWNLOAD_SECONDS))

    def reject(self, context, boot_image_id, reason):
        """Records on the boot image that a host found it other than its image's data: no
        host uses it again, and the worker replaces it."""
        self.client.images.update(boot_image_id, **{contract.REJECTED: reason})


class Untrusted(Exception):
    pass


def untrusted(boot_image, source_image_id, owner, max_bytes, signed=False):
    """Why a published boot image is not to be used, or None. ``signed``: only one that
    carries a signature is (checked over its bytes once downloaded)."""
    properties = boot_image.get('properties') or {}
    if not owner or boot_image.get('owner') != owner:
        return 'owned by %s, not by the boot image publisher %s' % (boot_image.get('owner'), owner)
    if boot_image.get('container_format') != CONTAINER_FORMAT:
        return 'container format %s, not %s' % (boot_image.get('container_format'),
                                                CONTAINER_FORMAT)
    if properties.get(SOURCE_IMAGE_PROPERTY) != source_image_id:
        return 'built for image %s' % properties.get(SOURCE_IMAGE_PROPERTY)
    if boot_image.get('status') != 'active':
        return 'status %s' % boot_image.get('status')
    if (boot_image.get('size') or 0) > max_bytes:
        return '%d bytes, over the %d-byte limit' % (boot_image['size'], max_bytes)
    if properties.get(contract.REJECTED):
        return 'rejected by a compute host (%s)' % properties[contract.REJECTED]
    if signed and not properties.get(contract.SIGNATURE):
        return "not signed with the worker's key"
    return None


class BootImages:
    """This host's boot images, as yolofs (through ``backing_files``' client) reports them."""

    def __init__(self, backing_files, download_dir, fetch=True, image_api=None,
                 install_timeout=120.0, boot_image_api=None, owner=None,
                 max_bytes=1 << 30, signing_keys=(), version_check_interval=600,
                 clock=time.monotonic):
        self.backing_files = backing_files
        self.version_check_interval = version_check_interval
        self.clock = clock
        # Base file name -> when ensure() last asked Glance whether a newer boot image is out.
        self._version_checked = {}
        # The worker's public keys: without them, no boot image is known to be the worker's.
        self.verifier = signing.Verifier(signing_keys) if signing_keys else None
        self.download_dir = download_dir
        self.fetch = fetch
        self.install_timeout = install_timeout
        self.max_bytes = max_bytes
        self._image_api = image_api
        self._boot_image_api = boot_image_api
        self._owner = owner
        # Source image id -> the boot image yolofs refused for it: not downloaded again.
        self._refused = {}
        # Base file name -> the thread fetching its boot image after Nova's download, and
        # those fetching a newer version of the one installed (disks stay on the mount).
        self._fetching = {}
        self._moving = {}
        # The record of which boot image is installed for each base file (installed.json).
        self._installed_lock = threading.Lock()
        self._fetching_lock = threading.Lock()
        # The sizes of the last boot images installed, against their base files'.
        self._sizes = collections.deque(maxlen=20)
        # Boot images held before their base files (warming.WarmStore), if the host warms.
        self.warm_store = None

    @property
    def image_api(self):
        """Nova's image API, with the booting user's context: the source image."""
        if self._image_api is None:
            from nova.image import glance
            self._image_api = glance.API()
        return self._image_api

    @property
    def boot_image_api(self):
        """Glance with the service identity: the boot images."""
        if self._boot_image_api is None:
            from nova import conf
            self._boot_image_api = ServiceGlance(conf.CONF)
        return self._boot_image_api

    @property
    def owner(self):
        """The project whose boot images are trusted: the worker's, which is configured or,
        by default, the service identity's own."""
        return self._owner or self.boot_image_api.project_id

    @property
    def client(self):
        return self.backing_files.client

    def ensure(self, context, image_id, base_path, later=False, image=None):
        """Makes sure yolofs has the base file's boot image if Glance publishes one.
        ``image``: the image as Nova's image API gives it, if the caller has it already (it is
        then not asked for again).

        Returns what happened: 'unavailable' (yolofs is not healthy: nothing attempted),
        'present' (a boot image Glance published, or one learned here while Glance publishes
        none), 'none' (no boot image published: yolofs learns one from the first boot if it
        runs with --learn), 'installed', 'rejected' (yolofs refused it) or 'failed'; with
        ``later``, 'fetching': a thread fetches and installs it, and until it is done the
        guests over the base file start on ``_base``. For a base file Nova has just downloaded:
        the boot's bytes are in the page cache, where the boot image would bring nothing to
        this boot, and fetching it first would delay the guest's start by its transfer, on the
        link the download has just used. On the mount meanwhile, a learning yolofs would record
        the boot the boot image already holds.
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
            usable = status.usable(name)
            # One this host learned from its own boots (perhaps a boot that failed early, or
            # while Glance was away) gives way to the one Glance publishes, built from a whole
            # boot and trusted. One installed from Glance gives way to a newer version (a
            # merge of what hosts' boots read outside it: yolo_glance/fleet.py), looked for
            # once per version_check_interval.
            if usable and not status.boot_images[name].learned:
                if self.fetch and self._version_check_due(name):
                    self._check_version_later(context, name, image_id, image)
                return 'present'
            if usable and not self.fetch:
                return 'present'
            if not self.fetch:
                return 'none'
            if self.fetching(name) is not None:
                return 'fetching'
            if image is None:
                image = self.image_api.get(context, image_id)
            boot_image = self.trusted_boot_image(context, image_id, image)
            if boot_image is None:
                if usable:
                    return 'present'
                published = (image.get('properties') or {}).get(BOOT_IMAGE_PROPERTY)
                return 'rejected' if published else 'none'
            if later and not usable:
                return self._install_later(context, name, image_id, boot_image)
            return self._install(context, name, image_id, boot_image)
        except Untrusted:
            return 'rejected'
        except Exception:
            # A boot image only makes boots faster; nothing about it may stop one.
            LOG.exception('Could not get the boot image of image %s to yolofs', image_id)
            return 'failed'

    def trusted_boot_image(self, context, image_id, image):
        """The boot image Glance publishes for ``image`` (Nova's image API's view of it), as
        the service identity sees it, if it is one to use; else None, and if one was refused
        its id is remembered. Its signature is checked by :meth:`download`."""
        boot_image_id = (image.get('properties') or {}).get(BOOT_IMAGE_PROPERTY)
        if not boot_image_id:
            LOG.debug('Image %s has no published boot image', image_id)
            return None
        if self._refused.get(image_id) == boot_image_id:
            return None
        boot_image = self.boot_image_api.get(context, boot_image_id)
        reason = untrusted(boot_image, image_id, self.owner, self.max_bytes,
                           signed=self.verifier is not None)
        if reason:
            LOG.warning('Not using boot image %s of image %s: %s', boot_image_id, image_id,
                        reason)
            self.refuse(image_id, boot_image_id)
            return None
        return boot_image

    def download(self, context, name, boot_image, image_id):
        """Downloads ``boot_image`` (of image ``image_id``) into the download directory, for
        base file ``name`` (or links it from the warm store, which holds it), and checks its
        signature over the bytes; returns its path (the caller deletes it), a file yolofs
        (root) can read. Raises Untrusted (the boot image is refused) if the signature does not
        verify."""
        os.makedirs(self.download_dir, mode=0o755, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix=name + '.', suffix='.yolo', dir=self.download_dir)
        os.close(fd)
        warm = self.warm_store is not None and self.warm_store.link_for(
            image_id, boot_image['id'], path)
        try:
            if warm and self.verifier is not None and self._signature_problem(
                    boot_image, image_id, path):
                # This host's copy changed since it was fetched: Glance's may well be right.
                LOG.error('The warm store\'s copy of boot image %s is not what the worker '
                          'signed: removed, and downloaded again', boot_image['id'])
                self.warm_store.drop(image_id)
                os.unlink(path)
                warm = False
            if warm:
                LOG.info('Boot image %s for base file %s: from the warm store',
                         boot_image['id'], name)
            else:
                LOG.info('Downloading boot image %s for base file %s', boot_image['id'], name)
                self.boot_image_api.download(context, boot_image['id'], dest_path=path)
                if self.verifier is not None:
                    self._check_signature(boot_image, image_id, path)
            # yolofs runs as root and reads it (root could anyway); it must stay our own file.
            os.chmod(path, 0o644)
        except BaseException:
            fileutils.delete_if_exists(path)
            raise
        return path

    def remove_leftover_downloads(self):
        """Deletes the downloads an earlier nova-compute left (stopped mid-download)."""
        try:
            leftovers = [entry for entry in os.scandir(self.download_dir)
                         if entry.name.endswith('.yolo') and entry.is_file(follow_symlinks=False)]
        except FileNotFoundError:
            return
        for entry in leftovers:
            LOG.info('Deleting %s, a boot image download an earlier nova-compute left',
                     entry.path)
            fileutils.delete_if_exists(entry.path)

    def _signature_problem(self, boot_image, image_id, path):
        """Why the file at ``path`` is not the boot image the worker signed, or None."""
        algorithm = boot_image.get('os_hash_algo') or ''
        try:
            signature = (boot_image.get('properties') or {}).get(contract.SIGNATURE)
            if self.verifier.verify(signature, image_id, algorithm,
                                    signing.file_digest(path, algorithm)):
                return None
            return "its signature is not the worker's over the bytes downloaded"
        except signing.SigningError as e:
            return str(e)

    def _check_signature(self, boot_image, image_id, path):
        reason = self._signature_problem(boot_image, image_id, path)
        if reason is None:
            return
        LOG.error('ALARM: not using boot image %s of image %s: %s', boot_image['id'],
                  image_id, reason)
        self.refuse(image_id, boot_image['id'])
        raise Untrusted(reason)

    def _install(self, context, name, image_id, boot_image):
        path = self.download(context, name, boot_image, image_id)
        try:
            return self.install_file(name, path, image_id, boot_image['id'])
        finally:
            os.unlink(path)

    def _in_thread(self, jobs, name, target, *args):
        """Runs ``target(*args)`` in a thread registered in ``jobs`` under base file ``name``
        until it ends, unless one is registered there already."""
        with self._fetching_lock:
            if name in jobs:
                return
            thread = threading.Thread(target=self._job, name='yolo-boot-image-' + name[:8],
                                      args=(jobs, name, target, args), daemon=True)
            jobs[name] = thread
        try:
            thread.start()
        except BaseException:
            self._fetched(name, jobs)
            raise

    def _job(self, jobs, name, target, args):
        try:
            target(*args)
        finally:
            self._fetched(name, jobs)

    def _install_later(self, context, name, image_id, boot_image):
        """Installs ``boot_image`` from a thread (registered in ``_fetching``: disks over the
        base file stay on ``_base`` until it is done)."""
        self._in_thread(self._fetching, name, self._fetch, context, name, image_id, boot_image)
        return 'fetching'

    def _fetch(self, context, name, image_id, boot_image):
        try:
            self._install(context, name, image_id, boot_image)
        except Untrusted:
            pass
        except Exception:
            LOG.exception('Could not get the boot image of image %s to yolofs', image_id)

    def _fetched(self, name, jobs):
        with self._fetching_lock:
            del jobs[name]

    def _check_version_later(self, context, name, image_id, image):
        """From a thread (registered in ``_moving``), installs the boot image Glance links from
        ``image_id`` if it is not the one installed here for base file ``name`` (a new version:
        fleet merges make them, and the worker links the one to use). Guests keep booting from
        the installed one meanwhile; a failure changes nothing."""
        self._in_thread(self._moving, name, self._move, context, name, image_id, image)

    def _move(self, context, name, image_id, image):
        try:
            if image is None:
                image = self.image_api.get(context, image_id)
            linked = (image.get('properties') or {}).get(BOOT_IMAGE_PROPERTY)
            installed = self.installed_id(name)
            if not linked or linked == installed or self._refused.get(image_id) == linked:
                return
            boot_image = self.trusted_boot_image(context, image_id, image)
            if boot_image is None:
                return
            LOG.info('Image %s: installing boot image %s in place of %s', image_id,
                     boot_image['id'], installed or 'the one installed here')
            self._install(context, name, image_id, boot_image)
        except Untrusted:
            pass
        except Exception:
            LOG.exception('Could not check whether image %s has a new boot image', image_id)

    def _version_check_due(self, name):
        now = self.clock()
        if now - self._version_checked.get(name, float('-inf')) < self.version_check_interval:
            return False
        self._version_checked[name] = now
        return True

    @property
    def _installed_file(self):
        return os.path.join(self.download_dir, INSTALLED_RECORD)

    def _installed(self):
        """installed.json: base file name -> the Glance id of the boot image installed for it
        ({} if missing or unreadable)."""
        try:
            with open(self._installed_file) as f:
                installed = json.load(f)
        except (OSError, ValueError):
            return {}
        return installed if isinstance(installed, dict) else {}

    def installed_id(self, name):
        """The Glance id of the boot image installed here for base file ``name``, if known."""
        return self._installed().get(name)

    def _remember_installed(self, name, boot_image_id):
        # Only base files yolofs still has a boot image of (the others were pruned).
        status = self.backing_files.status()
        with self._installed_lock:
            installed = self._installed()
            installed[name] = boot_image_id
            if status is not None:
                installed = {k: v for k, v in installed.items() if k in status.boot_images}
            os.makedirs(self.download_dir, mode=0o755, exist_ok=True)
            fd, staged = tempfile.mkstemp(dir=self.download_dir, prefix='.installed.')
            try:
                with os.fdopen(fd, 'w') as f:
                    json.dump(installed, f)
                os.replace(staged, self._installed_file)
            except BaseException:
                fileutils.delete_if_exists(staged)
                raise

    def fetching(self, name):
        """The thread fetching base file ``name``'s boot image (``ensure(later=True)``), if
        one is."""
        return self._fetching.get(name)

    def install_file(self, name, path, image_id, boot_image_id):
        """Has yolofs verify the boot image downloaded at ``path`` against base file ``name``
        and install it; returns 'installed', 'rejected' (remembered: not fetched again) or
        'failed'."""
        try:
            installed = self.client.install(name, path, image_id, timeout=self.install_timeout)
        except (OSError, ValueError, yolofs.YolofsError) as e:
            LOG.warning('yolofs did not install boot image %s for base file %s: %s',
                        boot_image_id, name, e)
            # A refused boot image is not fetched again; another failure (a full disk, yolofs
            # down) may pass.
            if isinstance(e, yolofs.YolofsError) and e.refused:
                self.refuse(image_id, boot_image_id)
                return 'rejected'
            return 'failed'
        LOG.info('Installed verified boot image %s for base file %s (yolofs: %s)',
                 boot_image_id, name, installed)
        self._version_checked[name] = self.clock()
        try:
            self._remember_installed(name, boot_image_id)
        except OSError as e:
            LOG.warning('Could not record which boot image is installed for %s (it will be '
                        'fetched again at a version check): %s', name, e)
        try:
            # Against the base file's data (its allocated bytes), which the image's size in
            # Glance stands for at the scheduler.
            self._sizes.append(installed.bytes / (
                os.stat(self.backing_files.base_path(name)).st_blocks * 512))
        except (OSError, ZeroDivisionError, TypeError):
            pass
        return 'installed'

    def refuse(self, image_id, boot_image_id):
        """Boot image ``boot_image_id`` of image ``image_id`` is never used again here."""
        self._refused[image_id] = boot_image_id

    def reject(self, image_id, boot_image_id, reason):
        """Boot image ``boot_image_id`` served bytes its image ``image_id`` does not hold: it
        is refused here, and the rejection recorded in Glance for every host and the worker."""
        self.refuse(image_id, boot_image_id)
        record = '%s %s: %s' % (socket.gethostname(), timeutils.utcnow().isoformat(
            timespec='seconds'), reason)
        try:
            self.boot_image_api.reject(None, boot_image_id, record[:255])
        except Exception:
            LOG.exception('Could not record in Glance that boot image %s was rejected',
                          boot_image_id)

    def verified_image_ids(self, status=None):
        """Glance image ids yolofs serves a verified, unrefused boot image for (``status``: an
        answer already fetched)."""
        if status is None:
            status = self.backing_files.status()
        return status.served_image_ids() if status is not None else set()

    def size_ratio(self):
        """The mean size of the last boot images installed here against their base files' data,
        or None before the first."""
        sizes = list(self._sizes)
        return sum(sizes) / len(sizes) if sizes else None

    def has_boot_image(self, name, status):
        """Whether yolofs (whose ``status`` answer this is, None if it did not answer) has a
        usable boot image for ``name``."""
        return status is not None and status.usable(name)

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
