"""Running guests leave the yolofs mount once their boot is over.

A guest reads through yolofs only to boot faster; afterwards nothing it does needs yolofs, yet
its disk's backing file is on the mount for as long as it runs, so a yolofs that dies would fail
its reads. So once its boot is over the driver moves the running guest's disk onto the same file
in ``_base``, live, with libvirt's block copy:

1. ``disk.yolo-detach``, a new qcow2 over ``_base/<name>``, receives a shallow copy of ``disk``
   (only what the guest wrote: the base file holds the same bytes as the mount's), then the guest
   pivots onto it;
2. ``disk`` is made again over ``_base/<name>``, receives the same copy back, and the guest pivots
   onto it; ``disk.yolo-detach`` goes.

Two copies, because libvirt has no call that only swaps a running disk's backing file
(QEMU's blockdev-reopen is internal to it), and Nova must find the disk at its own path. Each
pivot holds the disk's I/O while QEMU drains and switches (milliseconds); the vCPUs never stop.
Afterwards libvirt's live and persistent XML and the disk's header all name ``_base``. What the
guest is on is decided from libvirt's live XML, never from what a call answered: a copy that fails
before its pivot is abandoned (the guest stays where it was); a detach interrupted between the
pivots leaves ``disk.yolo-detach`` as the current disk, marked so, which the next start renames
back (:func:`recover`); if nova-compute or the host ended before the mark was written, its start
marks it from libvirt's XML (:func:`reconcile`).

A boot is over once yolofs' boot window of the base file has ended (no read for
``--record-idle-secs``) and ``detach_settle_seconds`` have passed, or after
``detach_max_seconds`` whatever yolofs says; a yolofs that does not answer is a reason to detach
at once (the copies never read the backing file).
"""

import contextlib
import os
import queue
import threading
import time
import xml.etree.ElementTree as ET

from oslo_log import log as logging

from yolo_common import images
from yolo_nova.virt import backing

LOG = logging.getLogger(__name__)

DETACH_SUFFIX = '.yolo-detach'
CURRENT_MARK = '.current'
POLL_SECONDS = 2.0
COPY_TIMEOUT = 300.0


_locks = {}
_locks_guard = threading.Lock()


def lock(instance_uuid):
    """Held by a detach, and by the driver's operations on a guest's disks (snapshots, reboots,
    migrations...), so that neither sees the other's half-done work. Re-entrant: Nova's
    operations call one another (a hard reboot destroys the guest first)."""
    with _locks_guard:
        return _locks.setdefault(instance_uuid, threading.RLock())


def recover(disk_path):
    """Before a start: a detach interrupted between its pivots left the guest's current disk at
    ``disk.yolo-detach``, marked so (``disk`` itself then holds no more than the base's bytes);
    an unmarked one is a copy whose pivot never took effect, or a leftover of a finished detach
    (init_host marks those libvirt names as current)."""
    interim = disk_path + DETACH_SUFFIX
    if os.path.exists(interim + CURRENT_MARK):
        LOG.warning('%s is the current disk of an interrupted detach: moving it back to %s',
                    interim, disk_path)
        os.replace(interim, disk_path)
        os.unlink(interim + CURRENT_MARK)
    elif os.path.exists(interim):
        LOG.info('Removing %s, an unfinished copy of %s', interim, disk_path)
        os.unlink(interim)


def mark_current(interim):
    """Records, durably, that the guest's current disk is the interim file."""
    mark = interim + CURRENT_MARK
    with open(mark, 'w') as f:
        f.write('the current disk of this instance is %s\n' % os.path.basename(interim))
        f.flush()
        os.fsync(f.fileno())
    directory = os.open(os.path.dirname(mark) or '.', os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def qcow2_file_disks(domain_xml):
    """[(target dev, source file, encrypted)] of a domain's file-backed qcow2 disks."""
    disks = []
    for disk in ET.fromstring(domain_xml).iterfind('./devices/disk'):
        driver, source, target = disk.find('driver'), disk.find('source'), disk.find('target')
        if disk.get('type') == 'file' and driver is not None and driver.get('type') == 'qcow2' \
                and source is not None and source.get('file'):
            disks.append((None if target is None else target.get('dev'), source.get('file'),
                          disk.find('.//encryption') is not None))
    return disks


def reconcile(domain_xml):
    """At nova-compute's start, for a guest libvirt knows (its live XML if it runs, else its
    persistent one, which libvirt rewrites at each pivot): a disk whose source is an interim
    file is marked current, so that the next start takes it back (a detach interrupted by
    nova-compute's or the host's end). Returns the interim files marked."""
    marked = []
    for _, path, _ in qcow2_file_disks(domain_xml):
        if path.endswith(DETACH_SUFFIX) and os.path.exists(path) \
                and not os.path.exists(path + CURRENT_MARK):
            LOG.warning('%s is the current disk of an interrupted detach: the next start of '
                        'its guest moves it back to %s', path, path[:-len(DETACH_SUFFIX)])
            mark_current(path)
            marked.append(path)
    return marked


def open_windows(status):
    """Base names with a boot window open, from yolofs' status answer."""
    return {window['name'] for window in (status or {}).get('recording') or ()}


def boot_is_over(status, base_names, elapsed, settle_seconds, max_seconds, window_seen):
    """Whether to detach now, ``elapsed`` seconds after the guest's start. ``status``: yolofs'
    status answer, None if it does not answer; ``window_seen``: a boot window of one of the
    guest's base files was open since its start (a guest waiting, paused, for its network has
    not begun to boot)."""
    if status is None or elapsed >= max_seconds:
        return True
    return window_seen and elapsed >= settle_seconds \
        and not open_windows(status) & set(base_names)


def disks_on_mount(domain_xml, backing_files):
    """[(target dev, disk path, base name)] of the domain's qcow2 disks backed by the mount
    (encrypted ones are left alone: the copy's destination would not be)."""
    found = []
    for dev, path, encrypted in qcow2_file_disks(domain_xml):
        if encrypted or not os.path.exists(path):
            continue
        info = backing.backing_info(path)
        if info is not None and backing_files.directory_of(info[0]) == 'mount':
            found.append((dev, path, os.path.basename(info[0])))
    return found


def move_backing(guest, dev, disk_path, backing_path):
    """The two copies above, onto ``backing_path`` (a file with the same bytes as the current
    backing file: ``_base``'s for a detach); returns the pivots' durations in seconds. Files are
    removed only once libvirt's live XML shows the guest is not on them."""
    info = images.info(disk_path)
    size, backing_format = info['virtual-size'], info.get('backing-filename-format', 'raw')
    interim = disk_path + DETACH_SUFFIX
    images.create_overlay(backing_path, interim, backing_format, size=size)
    try:
        first = pivot_onto(guest, dev, interim)
    except Exception:
        if current_source(guest, dev) == disk_path:
            os.unlink(interim)
        raise
    # The guest writes to the interim disk now: a start before the second pivot takes it.
    mark_current(interim)
    os.unlink(disk_path)
    images.create_overlay(backing_path, disk_path, backing_format, size=size)
    second = pivot_onto(guest, dev, disk_path)
    os.unlink(interim + CURRENT_MARK)
    os.unlink(interim)
    return first, second


def current_source(guest, dev):
    """The file the running guest's ``dev`` is now, per libvirt's live XML (None if unknown)."""
    try:
        sources = {d: path for d, path, _ in qcow2_file_disks(guest.get_xml_desc())}
        return sources.get(dev)
    except Exception:
        LOG.exception('Could not read the live XML of the guest')
        return None


def pivot_onto(guest, dev, destination):
    """copy_and_pivot, which succeeded if the guest is on ``destination`` afterwards whatever
    the calls said (a pivot takes effect in QEMU before libvirt answers: libvirtd restarting
    in between fails the call)."""
    try:
        return copy_and_pivot(guest, dev, destination)
    except Exception:
        if current_source(guest, dev) == destination:
            LOG.warning('The pivot onto %s failed but took effect', destination, exc_info=True)
            return float('nan')
        raise


def copy_and_pivot(guest, dev, destination):
    """A shallow block copy of ``dev`` into ``destination`` (a qcow2 over the same bytes as the
    current backing file), then a pivot onto it; returns how long the pivot took."""
    block = guest.get_block_device(dev)
    xml = "<disk type='file'><driver type='qcow2'/><source file='%s'/></disk>" % destination
    # TRANSIENT_JOB: libvirt refuses copies of persistent domains' disks otherwise (the job
    # cannot be resumed if the guest stops meanwhile: then the copy is simply lost).
    block.copy(xml, shallow=True, reuse_ext=True, transient=True)
    deadline = time.monotonic() + COPY_TIMEOUT
    try:
        while not block.is_job_complete():
            if time.monotonic() > deadline:
                raise TimeoutError('the copy to %s did not converge in %ss'
                                   % (destination, COPY_TIMEOUT))
            time.sleep(0.05)
        if block.get_job_info() is None:
            raise RuntimeError('the copy to %s ended before its pivot (cancelled?)' % destination)
        started = time.monotonic()
        block.abort_job(pivot=True)
        return time.monotonic() - started
    except Exception:
        # Cancelled if it still runs; a libvirtd that does not answer is left to the caller.
        with contextlib.suppress(Exception):
            if block.get_job_info() is not None:
                block.abort_job()
        raise


class Watch:
    """A started guest waiting for its boot to be over."""

    def __init__(self, instance_uuid, names, started):
        self.instance_uuid = instance_uuid
        self.names = names
        self.started = started
        self.window_seen = False


class Detacher:
    """Watches started guests and detaches each once its boot is over, one at a time, on a
    thread of its own (a copy of a few megabytes, two pivots)."""

    def __init__(self, backing_files, lookup_guest, settle_seconds, max_seconds):
        self.backing_files = backing_files
        self.lookup_guest = lookup_guest
        self.settle_seconds = settle_seconds
        self.max_seconds = max_seconds
        # Instance uuid -> [(dev, first pivot seconds, second pivot seconds)] of its last detach.
        self.detached = {}
        self._incoming = queue.Queue()
        self._thread = None
        self._thread_lock = threading.Lock()

    def watch(self, instance_uuid, base_names):
        with self._thread_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name='yolo-detach',
                                                daemon=True)
                self._thread.start()
        self._incoming.put(Watch(instance_uuid, frozenset(base_names), time.monotonic()))

    def _run(self):
        watched = {}
        while True:
            try:
                watch = self._incoming.get(timeout=POLL_SECONDS)
                watched[watch.instance_uuid] = watch
            except queue.Empty:
                pass
            if watched:
                try:
                    self._detach_finished_boots(watched)
                except Exception:
                    LOG.exception('Watching boots to detach guests from yolofs')

    def _detach_finished_boots(self, watched):
        status = self.backing_files.status()
        now = time.monotonic()
        for uuid, watch in list(watched.items()):
            watch.window_seen = watch.window_seen or bool(open_windows(status) & watch.names)
            if not boot_is_over(status, watch.names, now - watch.started, self.settle_seconds,
                                self.max_seconds, watch.window_seen):
                continue
            # A base file being filled (docs/first-boot.md) is not in _base yet to move onto.
            if not all(os.path.exists(self.backing_files.base_path(name))
                       for name in watch.names):
                continue
            # Not while Nova works on the guest (a migration may take long): next time round.
            if self.detach(uuid, wait=False) is not None:
                del watched[uuid]

    def detach(self, instance_uuid, wait=True):
        """Moves every disk of the running guest that is on the mount to ``_base``; returns
        [(dev, first pivot seconds, second pivot seconds)], or None if Nova holds the guest and
        ``wait`` is false. Never raises: a guest left on the mount runs on as before."""
        guest_lock = lock(instance_uuid)
        if not guest_lock.acquire(blocking=wait):
            return None
        done = []
        try:
            guest = self.lookup_guest(instance_uuid)
            if guest is None or not guest.is_active():
                return done
            for dev, path, name in disks_on_mount(guest.get_xml_desc(), self.backing_files):
                pivots = move_backing(guest, dev, path, self.backing_files.base_path(name))
                LOG.info('Detached %s (%s) from yolofs: now over %s; pivots %.1f and %.1f ms',
                         dev, path, self.backing_files.base_path(name),
                         pivots[0] * 1e3, pivots[1] * 1e3)
                done.append((dev,) + pivots)
            self.detached[instance_uuid] = done
        except Exception:
            LOG.exception('Could not move instance %s off the yolofs mount: it stays there '
                          'until its next start', instance_uuid)
        finally:
            guest_lock.release()
        return done
