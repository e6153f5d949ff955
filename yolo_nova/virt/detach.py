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
guest is on is decided from libvirt's XML, asked until it answers, never from what a call
answered. A mark beside the interim file (:func:`mark`) says where the guest is as far as libvirt
said last, and whether a pivot away from it was asked for; nova-compute's start settles what a
detach left with libvirt (:func:`reconcile`), every start of a guest with the mark
(:func:`recover`), and nothing that may hold the guest's last write is deleted
(docs/nova-driver.md, Failures).

A boot is over once yolofs' boot window of the base file has ended (no read for
``--record-idle-secs``) and ``detach_settle_seconds`` have passed, or after
``detach_max_seconds`` whatever yolofs says; a yolofs that does not answer is a reason to detach
at once (the copies never read the backing file).
"""

import contextlib
import functools
import json
import os
import queue
import subprocess
import threading
import time
import xml.etree.ElementTree as ET

from oslo_log import log as logging

from yolo_common import images
from yolo_nova.virt import backing

LOG = logging.getLogger(__name__)

DETACH_SUFFIX = '.yolo-detach'
MARK_SUFFIX = '.current'
KEPT_SUFFIX = '.yolo-kept-'
POLL_SECONDS = 2.0
COPY_TIMEOUT = 300.0
LIBVIRT_ANSWER_SECONDS = 300.0
PIVOTING = ', pivoting away from it'


_locks = {}
_locks_guard = threading.Lock()


def lock(instance_uuid):
    """Held by a detach, and by the driver's operations on a guest's disks (snapshots, reboots,
    migrations...), so that neither sees the other's half-done work. Re-entrant: Nova's
    operations call one another (a hard reboot destroys the guest first)."""
    with _locks_guard:
        return _locks.setdefault(instance_uuid, threading.RLock())


def recover(disk_path):
    """Before a start (the guest is not running): settles a detach that did not finish, so that
    the guest starts on the file holding its writes, from the mark (see :func:`mark`):

    - no mark: ``disk.yolo-detach`` never was the guest's disk (a copy): removed;
    - the guest is on the file the mark names: that file becomes ``disk``;
    - a pivot away from the named file was under way: if ``disk`` holds nothing of its own,
      the interim file is the guest's; else which file the guest was last on is unknown here
      (libvirt's answer was lost with nova-compute or the host): the named one becomes
      ``disk``, the other is kept beside it, and an alarm says so."""
    interim = disk_path + DETACH_SUFFIX
    marked = read_mark(interim)
    if not os.path.exists(interim):
        if marked is not None:
            remove_mark(interim)
        return
    if marked is None or marked == (os.path.basename(disk_path), False):
        LOG.info('Removing %s, a copy that never became the disk of %s', interim, disk_path)
        os.unlink(interim)
        remove_mark(interim)
        return
    name, pivoting = marked
    if not pivoting or not os.path.exists(disk_path) or not holds_data(disk_path):
        LOG.warning('%s is the current disk of an interrupted detach: moving it back to %s',
                    interim, disk_path)
        os.replace(interim, disk_path)
        remove_mark(interim)
        return
    kept = disk_path + KEPT_SUFFIX + time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())
    if name == os.path.basename(interim):
        os.replace(disk_path, kept)
        os.replace(interim, disk_path)
    else:
        os.replace(interim, kept)
    sync_directory(disk_path)
    remove_mark(interim)
    LOG.error('ALARM: a detach of %s was interrupted during a pivot and libvirt could not say '
              'which file the guest was last on; both hold data. The guest starts on the one '
              'it was on before the pivot (now %s); the other is kept as %s: compare them '
              'before deleting it (docs/nova-driver.md)', disk_path, disk_path, kept)


def holds_data(disk_path):
    """Whether a qcow2 disk has clusters of its own (an overlay just made has none)."""
    image = json.dumps({'driver': 'qcow2', 'backing': None,
                        'file': {'driver': 'file', 'filename': str(disk_path)}})
    out = subprocess.run(['qemu-img', 'map', '--output=json', '-U', 'json:' + image],
                         check=True, capture_output=True, text=True).stdout
    return any(extent.get('present') for extent in json.loads(out))


def mark(interim, current, pivoting=False):
    """Records, durably, which file the guest's disk is as far as libvirt said last, and
    whether a pivot away from it is under way (requested, its outcome not known yet): written
    just before the first pivot (``disk``, pivoting), after it (``disk.yolo-detach``), before
    the second (``disk.yolo-detach``, pivoting), removed once the guest is known to be on
    ``disk`` again. Without a mark, ``disk.yolo-detach`` is at most a copy."""
    path = interim + MARK_SUFFIX
    with open(path + '.new', 'w') as f:
        f.write('the current disk of this instance is %s%s\n'
                % (os.path.basename(current), PIVOTING if pivoting else ''))
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + '.new', path)
    sync_directory(path)


def read_mark(interim):
    """(file name, pivoting) of a mark, None if there is no mark."""
    try:
        with open(interim + MARK_SUFFIX) as f:
            text = f.read().strip()
    except FileNotFoundError:
        return None
    pivoting = text.endswith(PIVOTING)
    return text.removesuffix(PIVOTING).split()[-1], pivoting


def remove_mark(interim):
    with contextlib.suppress(FileNotFoundError):
        os.unlink(interim + MARK_SUFFIX)
    sync_directory(interim)


def sync_directory(path):
    """Makes a rename or unlink in ``path``'s directory durable."""
    directory = os.open(os.path.dirname(path) or '.', os.O_RDONLY)
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


def reconcile(domain_xml, running):
    """At nova-compute's start, a detach it left unfinished is settled with what libvirt says
    of the guest: its live XML if it runs (what QEMU is on), else its persistent one (which
    libvirt rewrites once a pivot has taken effect).

    - On ``disk.yolo-detach``: marked so (its next start takes it back; a running guest is
      moved back by the detacher).
    - On ``disk``, running: what the detach left is stale, removed.
    - On ``disk``, stopped, the second pivot under way: it took effect, the rest is removed.
      During the first, libvirt may not have recorded a pivot that took effect: left to
      :func:`recover`.

    Returns [(dev, interim)] of the running guest's disks on an interim file."""
    on_interim = []
    for dev, path, _ in qcow2_file_disks(domain_xml):
        if path.endswith(DETACH_SUFFIX):
            if os.path.exists(path) and read_mark(path) != (os.path.basename(path), False):
                LOG.warning('%s is the current disk of an interrupted detach', path)
                mark(path, path)
            if running and os.path.exists(path):
                on_interim.append((dev, path))
            continue
        interim = path + DETACH_SUFFIX
        marked = read_mark(interim)
        if running or marked == (os.path.basename(interim), True):
            if os.path.exists(interim) or marked is not None:
                LOG.info('Removing %s, left by an interrupted detach: the guest is on %s',
                         interim, path)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(interim)
                remove_mark(interim)
    return on_interim


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


def disks_on_interim(domain_xml):
    """[(target dev, interim file)] of a domain's disks left on an interim file."""
    return [(dev, path) for dev, path, _ in qcow2_file_disks(domain_xml)
            if path.endswith(DETACH_SUFFIX)]


def move_backing(lookup_guest, dev, disk_path, backing_path):
    """The two copies above, onto ``backing_path`` (a file with the same bytes as the current
    backing file: ``_base``'s for a detach); returns the pivots' durations in seconds.
    ``lookup_guest``: the running guest, looked up again (a libvirtd that restarted needs a new
    connection). Raises if the guest did not end on ``disk``; a file is removed only once
    libvirt says the guest is not on it."""
    info = images.info(disk_path)
    size, backing_format = info['virtual-size'], info.get('backing-filename-format', 'raw')
    interim = disk_path + DETACH_SUFFIX
    images.create_overlay(backing_path, interim, backing_format, size=size)
    _step('interim created')
    first = pivot(lookup_guest, dev, disk_path, interim)
    if first is None:
        remove_mark(interim)
        os.unlink(interim)
        raise PivotFailed('the guest stayed on %s' % disk_path)
    mark(interim, interim)
    _step('on the interim disk')
    return first, move_back(lookup_guest, dev, disk_path, interim, backing_path, backing_format,
                            size)


def move_back(lookup_guest, dev, disk_path, interim, backing_path, backing_format, size):
    """The second copy: the guest, on ``interim``, back onto ``disk`` made again over
    ``backing_path``. Also how a detach that nova-compute left there is finished."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(disk_path)
    images.create_overlay(backing_path, disk_path, backing_format, size=size)
    _step('disk made again')
    second = pivot(lookup_guest, dev, interim, disk_path)
    if second is None:
        # Empty again, so that the next start takes the interim disk back without doubt.
        os.unlink(disk_path)
        images.create_overlay(backing_path, disk_path, backing_format, size=size)
        mark(interim, interim)
        raise PivotFailed('the guest stayed on %s' % interim)
    _step('back on the disk')
    remove_mark(interim)
    _step('mark removed')
    os.unlink(interim)
    sync_directory(interim)
    return second


class PivotFailed(Exception):
    """A pivot that libvirt says did not take effect (the guest is where it was)."""


def _step(name):
    """Each step of a detach, named for the tests that interrupt it there (fault injection:
    nova-compute killed, libvirtd restarted)."""


def pivot(lookup_guest, dev, source, destination):
    """copy_and_pivot from ``source`` to ``destination``; its duration in seconds (NaN if the
    call failed but the pivot took effect), None if the guest stayed on ``source``. Where the
    guest is afterwards is what libvirt's live XML says, never what a call answered (a pivot
    takes effect in QEMU before libvirt answers: libvirtd restarting in between fails the
    call), asked until libvirt answers. Raises LibvirtSilent if it does not in
    LIBVIRT_ANSWER_SECONDS: then the mark keeps both files for the next start. The mark says a
    pivot is under way from just before it is asked for."""
    interim = min(source, destination, key=len) + DETACH_SUFFIX
    try:
        return copy_and_pivot(lookup_guest(), dev, destination,
                              before_pivot=lambda: mark(interim, source, pivoting=True))
    except Exception:
        LOG.warning('The copy of %s onto %s failed', dev, destination, exc_info=True)
    guest, where = where_is(lookup_guest, dev)
    if where == destination:
        LOG.warning('The pivot onto %s took effect all the same', destination)
        return float('nan')
    if where == source:
        # A copy still running would keep writing into a file about to go.
        with contextlib.suppress(Exception):
            block = guest.get_block_device(dev)
            if block.get_job_info() is not None:
                block.abort_job()
        return None
    raise LibvirtSilent('libvirt names %s for %s, neither %s nor %s'
                        % (where, dev, source, destination))


class LibvirtSilent(Exception):
    """libvirt did not say where a guest's disk is."""


def where_is(lookup_guest, dev):
    """(guest, the file ``dev`` is on per libvirt's XML), asking until libvirt answers (at most
    LIBVIRT_ANSWER_SECONDS; (None, None) then)."""
    deadline = time.monotonic() + LIBVIRT_ANSWER_SECONDS
    while True:
        try:
            guest = lookup_guest()
            if guest is not None:
                sources = {d: path for d, path, _ in qcow2_file_disks(guest.get_xml_desc())}
                return guest, sources.get(dev)
        except Exception:
            LOG.debug('libvirt does not answer yet', exc_info=True)
        if time.monotonic() > deadline:
            return None, None
        time.sleep(1)


def copy_and_pivot(guest, dev, destination, before_pivot):
    """A shallow block copy of ``dev`` into ``destination`` (a qcow2 over the same bytes as the
    current backing file), then ``before_pivot()`` and a pivot onto it; returns how long the
    pivot took."""
    block = guest.get_block_device(dev)
    # A copy left by a detach that nova-compute did not finish (Nova's own block jobs run
    # under the detach lock): cancelled (synchronously), its destination is not the disk.
    if block.get_job_info() is not None:
        LOG.warning('Cancelling the block job left on %s', dev)
        block.abort_job()
    xml = "<disk type='file'><driver type='qcow2'/><source file='%s'/></disk>" % destination
    # TRANSIENT_JOB: libvirt refuses copies of persistent domains' disks otherwise (the job
    # cannot be resumed if the guest stops meanwhile: then the copy is simply lost).
    block.copy(xml, shallow=True, reuse_ext=True, transient=True)
    deadline = time.monotonic() + COPY_TIMEOUT
    while not block.is_job_complete():
        if time.monotonic() > deadline:
            raise TimeoutError('the copy to %s did not converge in %ss'
                               % (destination, COPY_TIMEOUT))
        time.sleep(0.05)
    if block.get_job_info() is None:
        raise RuntimeError('the copy to %s ended before its pivot (cancelled?)' % destination)
    _step('copied')
    before_pivot()
    _step('pivoting')
    started = time.monotonic()
    block.abort_job(pivot=True)
    seconds = time.monotonic() - started
    _step('pivoted')
    return seconds


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

    def watch(self, instance_uuid, base_names, at_once=False):
        """``at_once``: the guest is not booting here (it arrived by live migration, or a
        detach was left halfway): it is detached at the next round."""
        with self._thread_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name='yolo-detach',
                                                daemon=True)
                self._thread.start()
        started = time.monotonic() - (self.max_seconds if at_once else 0)
        self._incoming.put(Watch(instance_uuid, frozenset(base_names), started))

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
        """Moves every disk of the running guest that is on the mount to ``_base``, and
        finishes a detach left halfway (a disk on its interim file); returns
        [(dev, first pivot seconds, second pivot seconds)], or None if Nova holds the guest and
        ``wait`` is false. Never raises: a guest left where it was runs on as before."""
        guest_lock = lock(instance_uuid)
        if not guest_lock.acquire(blocking=wait):
            return None
        done = []
        try:
            guest = self.lookup_guest(instance_uuid)
            if guest is None or not guest.is_active():
                return done
            xml = guest.get_xml_desc()
            lookup = functools.partial(self.lookup_guest, instance_uuid)
            for dev, path, name in disks_on_mount(xml, self.backing_files):
                base = self.backing_files.base_path(name)
                pivots = move_backing(lookup, dev, path, base)
                LOG.info('Detached %s (%s) from yolofs: now over %s; pivots %.1f and %.1f ms',
                         dev, path, base, pivots[0] * 1e3, pivots[1] * 1e3)
                done.append((dev,) + pivots)
            for dev, interim in disks_on_interim(xml):
                info = images.info(interim)
                second = move_back(lookup, dev, interim[:-len(DETACH_SUFFIX)], interim,
                                   info['backing-filename'],
                                   info.get('backing-filename-format', 'raw'),
                                   info['virtual-size'])
                LOG.info('Finished the detach of %s, left on %s', dev, interim)
                done.append((dev, float('nan'), second))
            self.detached[instance_uuid] = done
        except Exception:
            LOG.exception('Could not move instance %s off the yolofs mount; where its disks '
                          'are is settled at its next start', instance_uuid)
        finally:
            guest_lock.release()
        return done
