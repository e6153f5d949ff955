"""Which file an instance disk's backing file is: the yolofs mirror or the real ``_base`` file.

Both hold the same bytes under the same name, so switching is a header-only ``qemu-img rebase -u``
and Nova, which only ever looks at the backing file's basename (image cache manager, disk info,
migrations), never notices. The rule is one line: a disk points at the mount only while yolofs is
mounted and answering; every start of a guest re-applies it, so an instance always starts.
"""

import contextlib
import os

from oslo_log import log as logging

from yolo_common import yolofs

LOG = logging.getLogger(__name__)

# Base files Nova creates itself (blank, formatted locally): a boot reads little of them and no
# boot image can exist for them, so ephemeral and swap disks stay on _base.
LOCAL_BASE_PREFIXES = ('ephemeral_', 'swap_')
# How a disk was made (BackingFiles.made).
AFTER_DOWNLOAD, OVER_FILL = 'after download', 'over fill'


class BackingFiles:
    """The rule above for one compute host: its image cache and its yolofs mount."""

    def __init__(self, base_dir, mount_point, control_socket, control_timeout, enabled=True):
        self.base_dir = os.path.realpath(base_dir)
        self.mount_point = os.path.realpath(mount_point)
        self.client = yolofs.ControlClient(control_socket, timeout=control_timeout)
        self.enabled = enabled
        # Disks inside on_base(): any placement Nova's nested calls make keeps them on _base.
        self._held_on_base = set()
        # Disks made right after Nova downloaded their base file or over one being filled, until
        # their guest's boot is timed or not (host_report): {disk: AFTER_DOWNLOAD or OVER_FILL}.
        self._made = {}
        # This host's fills of base files (first_boot.FirstBoots), if first boots before the
        # download are on: a base file being filled is in _base only once complete.
        self.first_boots = None
        # This host's downloads and conversions (transfers.Transfers), which Nova's and the
        # fills' join.
        self.transfers = None
        # This host's boot images (boot_images.BootImages): while a base file's boot image is
        # fetched after Nova's download, its guests start on _base, as Nova's would
        # (BootImages.ensure says why).
        self.boot_images = None

    def mounted(self):
        return yolofs.is_mounted(self.mount_point)

    def status(self):
        """yolofs' status answer if it is enabled, mounted on the mount point and answering on
        its control socket; else None."""
        if not self.enabled or not self.mounted():
            return None
        try:
            return self.client.status()
        except (OSError, ValueError, yolofs.YolofsError) as e:
            LOG.warning('yolofs is mounted on %s but does not answer on %s: %s',
                        self.mount_point, self.client.path, e)
            return None

    def yolofs_healthy(self):
        return self.status() is not None

    def is_image_base(self, name):
        """A Glance image's base file (``sha1(image id)``), as opposed to ephemeral and swap."""
        return not name.startswith(LOCAL_BASE_PREFIXES)

    def mount_path(self, name):
        return os.path.join(self.mount_point, name)

    def base_path(self, name):
        return os.path.join(self.base_dir, name)

    def place(self, disk_path, healthy=None):
        """Points ``disk_path``'s backing file where the rule says; returns where it points.

        Disks whose backing file is neither in ``_base`` nor on the mount (flat disks, snapshot
        bases during unshelve, volumes) are left alone. ``healthy``: a health check already made.
        """
        info = backing_info(disk_path)
        if info is None:
            return None
        backing, fmt = info
        name = os.path.basename(backing)
        if self.directory_of(backing) is None or not self.is_image_base(name):
            return backing
        if os.path.realpath(disk_path) in self._held_on_base or (
                self.boot_images is not None and self.boot_images.fetching(name)):
            healthy = False
        elif healthy is None:
            healthy = self.yolofs_healthy()
        if healthy and os.path.exists(self.mount_path(name)):
            wanted = self.mount_path(name)
        else:
            wanted = self.base_path(name)
            self.wait_for_fill(name)
        if wanted != backing:
            rebase_unsafe(disk_path, wanted, fmt)
            LOG.info('%s: backing file %s -> %s', disk_path, backing, wanted)
        return wanted

    @contextlib.contextmanager
    def on_base(self, disk_path):
        """Backs ``disk_path`` by ``_base`` for the duration, then places it again.

        For Nova's own ``qemu-img`` runs on a disk (resize, cold snapshot, the safe rebase of
        unshelve), which open the whole backing chain: through the mount they would need yolofs
        up, and their reads would be taken by a learning yolofs for the start of a boot. Placements
        made meanwhile (unshelve creates the original image's disk object again, which places
        it) keep it on ``_base``.
        """
        held = os.path.realpath(disk_path)
        self._held_on_base.add(held)
        try:
            info = backing_info(disk_path)
            if info is not None and self.directory_of(info[0]) == 'mount':
                name = os.path.basename(info[0])
                self.wait_for_fill(name)
                rebase_unsafe(disk_path, self.base_path(name), info[1])
            yield
        finally:
            self._held_on_base.discard(held)
        self.place(disk_path)

    def made(self, disk_path, how):
        """Disk ``disk_path`` was just made ``how``: AFTER_DOWNLOAD (over a base file Nova had
        just downloaded) or OVER_FILL (over a base file being filled)."""
        self._made[os.path.realpath(disk_path)] = how

    def take_how_made(self, disk_path):
        """How disk ``disk_path`` was made, if it was made AFTER_DOWNLOAD or OVER_FILL (forgotten
        once asked), else None."""
        return self._made.pop(os.path.realpath(disk_path), None)

    def wait_for_fill(self, name):
        """Waits for base file ``name`` to be in _base if it is being filled: what a guest
        started over it without yolofs, or Nova's own qemu-img, needs (the fill is the download
        Nova's normal path would have waited for)."""
        fill = self.first_boots.running(name) if self.first_boots is not None else None
        if fill is not None and not os.path.exists(self.base_path(name)):
            LOG.info('Waiting for base file %s to be filled', name)
            fill.wait()

    def directory_of(self, backing):
        """'mount' or 'base' for a backing file in either directory, else None."""
        directory = os.path.normpath(os.path.dirname(backing))
        if directory == self.mount_point:
            return 'mount'
        # Not realpath on the mount point: with yolofs dead, stat there fails (ENOTCONN).
        if os.path.realpath(directory) == self.base_dir:
            return 'base'
        return None

    def uses_mount(self, disk_path):
        info = backing_info(disk_path)
        return info is not None and self.directory_of(info[0]) == 'mount'


def backing_info(disk_path):
    """(backing file, backing format) of a qcow2 disk, or None if it has none."""
    # Imported here: nova.virt.images pulls in Nova's whole config, which the scheduler side of
    # yolo_nova does not need.
    from nova.virt import images
    info = images.qemu_img_info(disk_path)
    if info.file_format != 'qcow2' or not info.backing_file:
        return None
    fmt = info.backing_file_format or 'raw'
    return info.backing_file, fmt


def rebase_unsafe(disk_path, backing, fmt):
    """Rewrites only the header: the new backing file holds the same bytes as the old one. As
    root, through Nova's privsep: a running guest's disk belongs to libvirt's QEMU user."""
    from nova.virt import yolo
    yolo.rebase_unsafe(disk_path, backing, fmt)
