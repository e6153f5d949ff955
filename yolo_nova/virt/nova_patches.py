"""Every replacement of a Nova internal (Nova 34), in one place.

Where Nova has no hook, the module function it looks up at each call is replaced by a wrapper of
it, once per process (:func:`install`, from the driver's ``__init__``). Each target, and the way
Nova calls it, is checked against the installed Nova by tests/unit/virt/test_nova_patches.py, so
that a Nova upgrade that moves one fails there rather than silently here. The driver's and the
image backend's overrides of Nova's methods are hooks of their subclasses (virt/driver.py,
virt/imagebackend.py); the same tests check that Nova still has each method they override.
"""

import functools
import os
import time

from lxml import etree
from nova.virt import images
from nova.virt.libvirt import imagebackend
from nova.virt.libvirt import migration as libvirt_migrate
from nova.virt.libvirt import utils as libvirt_utils
from oslo_log import log as logging

from yolo_common import yolofs
from yolo_nova.virt import transfers

LOG = logging.getLogger(__name__)


def returning_no_backing_stores(get_updated_guest_xml):
    """``nova.virt.libvirt.migration.get_updated_guest_xml``, whose domain XML comes without
    backingStore (see without_backing_stores).

    The destination XML of a live migration is the source guest's live XML: its backingStore
    names the source's chain (the mount, maybe), which the destination would open as named.
    Without it, the destination reads the chain from the disks' headers, placed there."""
    @functools.wraps(get_updated_guest_xml)
    def wrapped(*args, **kwargs):
        return without_backing_stores(get_updated_guest_xml(*args, **kwargs))
    wrapped.without_backing_stores = True
    return wrapped


def naming_base_files(get_disk_backing_file):
    """``nova.virt.libvirt.utils.get_disk_backing_file``, which names a backing file on the mount
    by the same file in ``_base`` (same bytes, same name) when asked for a full path.

    A live snapshot creates its delta over the disk's backing file, as a full path, and reads the
    whole chain to extract it: over the mount that needs yolofs up, and its reads would count as
    a boot's in a learning window. Nova asks for that path (``basename=False``) for the live
    snapshot only. Installed for good: a wrapper put in place and taken away around each
    snapshot would race with concurrent snapshots."""
    def wrapped(path, basename=True, format=None):
        backing = get_disk_backing_file(path, basename=basename, format=format)
        files = wrapped.backing_files
        if backing and not basename and files.directory_of(backing) == 'mount':
            return files.base_path(os.path.basename(backing))
        return backing
    return wrapped


def touching_through_yolofs(update_utime):
    """``nova.virt.libvirt.imagebackend._update_utime_ignore_eacces``, which has yolofs set the
    times of the base files in ``_base``, and Nova itself only if yolofs cannot.

    Nova's image backend sets a base file's times at each disk it creates over it (the image
    cache manager ages base files by their mtime), which moves the file's ctime: yolofs would
    verify the boot image again as the guest starts, reading the boot's bytes from the disk.
    yolofs sets the times itself and keeps the verification."""
    def wrapped(path):
        files, name = wrapped.backing_files, os.path.basename(path)
        if files.directory_of(path) == 'base' and files.is_image_base(name):
            try:
                files.client.touch(name)
                return
            except (OSError, ValueError, yolofs.YolofsError) as e:
                LOG.debug('yolofs did not set the times of %s (%s): Nova does', name, e)
        update_utime(path)
    return wrapped


def timing_downloads(fetch):
    """``nova.virt.images.fetch``, which records each download of an image from Glance (its
    bytes, as written, and its time) in the host's Transfers (virt/transfers.py): the rate the
    host reports, from Nova's own downloads."""
    def wrapped(context, image_href, path, trusted_certs=None):
        started = time.monotonic()
        fetch(context, image_href, path, trusted_certs)
        record(wrapped, transfers.DOWNLOAD, path, time.monotonic() - started)
    return wrapped


def timing_conversions(convert_image):
    """``nova.virt.images.convert_image``, which records Nova's conversions of a download to a
    raw base file (``fetch_to_raw``'s, to ``PATH.converted``), by the download's bytes: the
    scheduler knows an image's size in Glance, not its raw size."""
    def wrapped(source, dest, in_format, out_format, *args, **kwargs):
        started = time.monotonic()
        convert_image(source, dest, in_format, out_format, *args, **kwargs)
        if out_format == 'raw' and dest.endswith('.converted'):
            record(wrapped, transfers.CONVERSION, source, time.monotonic() - started)
    return wrapped


def record(wrapper, kind, path, seconds):
    # Measuring never fails Nova's call.
    try:
        if wrapper.backing_files.transfers is not None:
            wrapper.backing_files.transfers.record(kind, os.path.getsize(path), seconds)
    except Exception as e:
        LOG.debug('Not recording the %s of %s: %s', kind, path, e)


# (Nova's module, the function replaced, its wrapper).
PATCHES = (
    (libvirt_migrate, 'get_updated_guest_xml', returning_no_backing_stores),
    (libvirt_utils, 'get_disk_backing_file', naming_base_files),
    (imagebackend, '_update_utime_ignore_eacces', touching_through_yolofs),
    (images, 'fetch', timing_downloads),
    (images, 'convert_image', timing_conversions),
)


def install(backing_files):
    """Every patch, whose wrappers serve ``backing_files`` (virt.backing.BackingFiles)."""
    for module, name, wrap in PATCHES:
        wrap_once(module, name, wrap, backing_files)


def wrap_once(module, name, wrap, backing_files):
    """Replaces Nova's ``module.name`` by ``wrap(it)``, whose ``backing_files`` attribute names
    the BackingFiles it serves: once per process, later calls only point it at theirs (a compute
    service has one driver)."""
    current = getattr(module, name)
    if not hasattr(current, 'backing_files'):
        current = functools.wraps(current)(wrap(current))
        setattr(module, name, current)
    current.backing_files = backing_files


def without_backing_stores(xml):
    """``xml`` without the ``<backingStore>`` of its file-backed qcow2 disks (unchanged if none)."""
    if '<backingStore' not in xml:
        return xml
    root = etree.fromstring(xml)
    for disk in root.iterfind('./devices/disk'):
        driver = disk.find('driver')
        if disk.get('type') == 'file' and driver is not None and driver.get('type') == 'qcow2':
            for chain in disk.findall('backingStore'):
                disk.remove(chain)
    return etree.tostring(root, encoding='unicode')
