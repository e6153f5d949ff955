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
guest is on is what libvirt's live XML says once no block job is left on the disk, asked until it
answers, never what a call answered. A mark beside the interim file (:func:`mark`) says where
the guest is as far as libvirt said last, and whether a pivot away from it was asked for; what a
detach left is settled with libvirt (:func:`settle_guest`) when nova-compute starts and before
Nova stops or moves the guest, and with the mark before every start (:func:`recover`); nothing
that may hold the guest's last write is deleted (docs/nova-driver.md, Failures).

A boot is over once yolofs' boot window of the base file has ended (no read for
``--record-idle-secs``) and ``detach_settle_seconds`` have passed, or after
``detach_max_seconds`` whatever yolofs says; a yolofs that does not answer is a reason to detach
at once (the copies never read the backing file).
"""

import collections
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
import psutil

from yolo_common import images
from yolo_nova.virt import backing

LOG = logging.getLogger(__name__)

DETACH_SUFFIX = '.yolo-detach'
MARK_SUFFIX = '.current'
KEPT_SUFFIX = '.yolo-kept-'
POLL_SECONDS = 2.0
COPY_TIMEOUT = 300.0
LIBVIRT_ANSWER_SECONDS = 300.0
# A failed detach is tried again after each of these, then left to the guest's next start.
RETRY_SECONDS = (30, 120, 600)
PIVOTING = ', pivoting away from it'


_locks = {}
_locks_guard = threading.Lock()


def lock(instance_uuid):
    """Held by a detach, and by the driver's operations on a guest's disks (snapshots, reboots,
    migrations...), so that neither sees the other's half-done work. Re-entrant: Nova's
    operations call one another (a hard reboot destroys the guest first)."""
    with _locks_guard:
        return _locks.setdefault(instance_uuid, threading.RLock())


def disk_of(path):
    """The guest's disk path of ``path``, the disk itself or its interim file."""
    return path.removesuffix(DETACH_SUFFIX)


def recover(disk_path):
    """Before a start (the guest is not running): settles a detach that did not finish, so that
    the guest starts on the file holding its writes, from the mark (see :func:`mark`):

    - no mark: ``disk.yolo-detach`` never was the guest's disk (a copy): removed;
    - the guest is on the interim file: it becomes ``disk``;
    - a pivot was asked for and its outcome is unknown: if ``disk`` holds nothing of its own
      the interim file is the guest's; else both hold data and which one the guest was last on
      is unknown here: the file it was on before the pivot becomes ``disk``, the other is kept
      beside it, and an alarm says so.

    Raises if it cannot tell (the start must not go on over the wrong file)."""
    interim = disk_path + DETACH_SUFFIX
    marked = read_mark(interim)
    if not os.path.exists(interim):
        if marked is not None:
            remove_mark(interim)
        return
    if marked is None:
        LOG.info('Removing %s, a copy that never became the disk of %s', interim, disk_path)
        os.unlink(interim)
        return
    name, pivoting = marked.current, marked.pivoting
    if not pivoting and name == os.path.basename(disk_path):
        LOG.info('Removing %s: its detach was interrupted on %s', interim, disk_path)
        os.unlink(interim)
        remove_mark(interim)
        return
    if not pivoting or not os.path.exists(disk_path) or not holds_data(disk_path):
        LOG.warning('%s is the current disk of an interrupted detach: moving it back to %s',
                    interim, disk_path)
        os.replace(interim, disk_path)
        sync_directory(disk_path)
        remove_mark(interim)
        return
    kept = disk_path + KEPT_SUFFIX + time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())
    LOG.error('ALARM: a detach of %s was interrupted during a pivot and libvirt could not say '
              'which file the guest was last on; both hold data. The guest starts on the one '
              'it was on before the pivot (%s, now %s); the other is kept as %s: compare them '
              'before deleting it (docs/nova-driver.md)', disk_path, name, disk_path, kept)
    if name == os.path.basename(interim):
        os.replace(disk_path, kept)
        os.replace(interim, disk_path)
    else:
        os.replace(interim, kept)
    sync_directory(disk_path)
    remove_mark(interim)


def qcow2_alone(disk_path):
    """qemu-img's name for the qcow2 file alone, its backing file not opened."""
    return 'json:' + json.dumps({'driver': 'qcow2', 'backing': None,
                                 'file': {'driver': 'file', 'filename': str(disk_path)}})


def holds_data(disk_path):
    """Whether a qcow2 disk has clusters of its own (an overlay just made has none)."""
    out = subprocess.run(['qemu-img', 'map', '--output=json', '-U', qcow2_alone(disk_path)],
                         check=True, capture_output=True, text=True).stdout
    return any(extent.get('present') for extent in json.loads(out))


def held_by_qemu(path):
    """Whether a running QEMU has the disk open (it holds QEMU's image locks on it)."""
    if not os.path.exists(path):
        return False
    result = subprocess.run(['qemu-img', 'info', '--output=json', qcow2_alone(path)],
                            capture_output=True, text=True)
    return result.returncode != 0 and 'lock' in result.stderr


def discard(path):
    """Removes a disk file the guest was found not to be on; refuses one QEMU still holds
    (libvirt's answer and QEMU's state may differ for a moment around a pivot)."""
    if held_by_qemu(path):
        raise LibvirtSilent('%s is still open in QEMU' % path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sync_directory(path)


Mark = collections.namedtuple('Mark', 'current pivoting libvirt_unsure')


def mark(interim, current, pivoting=False, libvirt_unsure=False):
    """Records, durably, which file the guest's disk is as far as libvirt said last, and
    whether a pivot away from it was asked for and its outcome is not known yet: written just
    before the first pivot (``disk``, pivoting), after it (``disk.yolo-detach``), before the
    second (``disk.yolo-detach``, pivoting), removed once the guest is known to be on ``disk``
    again. Without a mark, ``disk.yolo-detach`` is at most a copy. ``libvirt_unsure``: libvirt
    did not settle the last pivot, or contradicted QEMU (see :func:`pivot`): its XML is not
    asked about this disk again until the guest has stopped."""
    path = interim + MARK_SUFFIX
    with open(path + '.new', 'w') as f:
        json.dump({'current': os.path.basename(current), 'pivoting': pivoting,
                   'libvirt_unsure': libvirt_unsure}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + '.new', path)
    sync_directory(path)


def read_mark(interim):
    """The Mark beside ``interim``, None if there is none. A mark that cannot be read says
    nothing sure: a pivot away from ``disk``, libvirt unsure: the start keeps both files."""
    path = interim + MARK_SUFFIX
    try:
        with open(path) as f:
            state = json.load(f)
        return Mark(str(state['current']), bool(state['pivoting']),
                    bool(state.get('libvirt_unsure')))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        LOG.error('The detach mark %s cannot be read', path)
        return Mark(os.path.basename(disk_of(interim)), True, True)


def remove_mark(interim):
    with contextlib.suppress(FileNotFoundError):
        os.unlink(interim + MARK_SUFFIX)
    sync_directory(interim)


def host_restarted_since(path):
    """Whether the host started after ``path`` was last written: libvirt's own definitions
    (renamed into place, their directory not synced) may then be older than they were."""
    return psutil.boot_time() > os.stat(path).st_mtime


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


def mirrors(domain_xml):
    """{target dev: state} of the disks with a block job's mirror: 'yes' (the copy is ready),
    'pivot' or 'abort' (being ended), '' (copying)."""
    found = {}
    for disk in ET.fromstring(domain_xml).iterfind('./devices/disk'):
        mirror, target = disk.find('mirror'), disk.find('target')
        if mirror is not None and target is not None:
            found[target.get('dev')] = mirror.get('ready') or ''
    return found


def reconcile(domain_xml, running, definition_reliable=None):
    """Settles what a detach left, with libvirt's XML of the guest.

    - Running: its live XML is what QEMU is on (once no block job is being ended:
      :func:`settle_jobs` first). On ``disk.yolo-detach``: marked so (the detacher moves it
      back, or its next start takes it back). On ``disk``: what the detach left is stale,
      removed.
    - Stopped: only a pivot whose outcome the mark does not know is settled, by libvirt's
      persistent definition, which libvirt rewrites once a pivot has taken effect; but it
      renames that file into place without syncing its directory, so after a host restart the
      definition may be older than the last pivot: then, and for every mark that already knows,
      the files are left to :func:`recover`.

    ``definition_reliable(interim)``: whether a stopped guest's definition can be trusted
    (default: the host has not restarted since the mark was written). Returns [(dev, interim)]
    of the running guest's disks on an interim file."""
    reliable = definition_reliable or (
        lambda interim: not host_restarted_since(interim + MARK_SUFFIX))
    on_interim = []
    for dev, path, _ in qcow2_file_disks(domain_xml):
        disk = disk_of(path)
        interim = disk + DETACH_SUFFIX
        marked = read_mark(interim)
        if marked is not None and marked.libvirt_unsure:
            continue
        if not running and (marked is None or not marked.pivoting or not reliable(interim)):
            continue
        if path == interim:
            if os.path.exists(interim):
                if marked != Mark(os.path.basename(interim), False, False):
                    LOG.warning('%s is the current disk of an interrupted detach', interim)
                    mark(interim, interim)
                if running:
                    on_interim.append((dev, interim))
        elif os.path.exists(interim) or marked is not None:
            LOG.info('Removing %s, left by an interrupted detach: the guest is on %s',
                     interim, disk)
            discard(interim)
            remove_mark(interim)
    return on_interim


def unsure_disks(domain_xml):
    """The domain's disks whose mark says libvirt lost track of a pivot (:func:`pivot`)."""
    unsure = []
    for _, path, _ in qcow2_file_disks(domain_xml):
        marked = read_mark(disk_of(path) + DETACH_SUFFIX)
        if marked is not None and marked.libvirt_unsure:
            unsure.append(path)
    return unsure


def settle_jobs(lookup_guest):
    """A running guest's block jobs left by a detach that nova-compute did not finish (Nova's
    own run under the detach lock): a pivot under way is waited for, a copy cancelled. Returns
    the guest's live XML once none is left."""
    for dev in mirrors(lookup_guest().get_xml_desc()):
        current_file(lookup_guest, dev)
    return lookup_guest().get_xml_desc()


def settle_guest(lookup_guest, backing_files):
    """What a detach left on a guest libvirt knows, settled (:func:`settle_jobs`,
    :func:`reconcile`); returns (the base names of its disks on the mount, whether a disk is
    on an interim file), both empty for a guest that does not run."""
    guest = lookup_guest()
    running = guest.is_active()
    if running and unsure_disks(guest.get_xml_desc()):
        return [], False     # libvirt is not asked again (pivot); the next start settles it
    xml = settle_jobs(lookup_guest) if running else guest.get_xml_desc(dump_inactive=True)
    on_interim = reconcile(xml, running)
    if not running:
        return [], False
    return [name for _, _, name in disks_on_mount(xml, backing_files)], bool(on_interim)


def open_windows(status):
    """Base names with a boot window open, from yolofs' status answer (None: no answer)."""
    return status.recording if status is not None else frozenset()


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
    ``lookup_guest``: the running guest, looked up again each time (a libvirtd that restarted
    needs a new connection). Raises if the guest did not end on ``disk``; a file is removed
    only once libvirt says, with no job left on the disk, that the guest is not on it, and QEMU
    does not hold it."""
    info = images.info(disk_path)
    size, backing_format = info['virtual-size'], info.get('backing-filename-format', 'raw')
    interim = disk_path + DETACH_SUFFIX
    images.create_overlay(backing_path, interim, backing_format, size=size)
    _step('interim created')
    where, first = pivot(lookup_guest, dev, disk_path, interim, interim)
    if where == disk_path:
        discard(interim)
        remove_mark(interim)
        raise PivotFailed('the guest stayed on %s' % disk_path)
    mark(interim, interim)
    _step('on the interim disk')
    return first, move_back(lookup_guest, dev, disk_path, interim, backing_path, backing_format,
                            size)


def move_back(lookup_guest, dev, disk_path, interim, backing_path, backing_format, size):
    """The second copy: the guest, on ``interim``, back onto ``disk`` made again over
    ``backing_path``; returns the pivot's duration. Also how a detach that nova-compute left
    there is finished."""
    discard(disk_path)
    images.create_overlay(backing_path, disk_path, backing_format, size=size)
    _step('disk made again')
    where, second = pivot(lookup_guest, dev, interim, disk_path, interim)
    if where == interim:
        # Empty again, so that the next start takes the interim disk back without doubt.
        discard(disk_path)
        images.create_overlay(backing_path, disk_path, backing_format, size=size)
        mark(interim, interim)
        raise PivotFailed('the guest stayed on %s' % interim)
    _step('back on the disk')
    remove_mark(interim)
    _step('mark removed')
    discard(interim)
    return second


class PivotFailed(Exception):
    """A pivot that libvirt says did not take effect (the guest is where it was)."""


class LibvirtSilent(Exception):
    """libvirt did not say where a guest's disk is, or QEMU and libvirt disagree."""


def _step(name):
    """Each step of a detach, named for the tests that interrupt it there (fault injection:
    nova-compute killed, libvirtd restarted)."""


def pivot(lookup_guest, dev, source, destination, interim):
    """A copy of ``dev`` from ``source`` onto ``destination``, then a pivot: (the file the guest
    is on afterwards, ``source`` or ``destination``; the seconds from the pivot's request to
    its end). Where the guest is, is what libvirt's live XML says once no job is left on the
    disk (:func:`current_file`), never what a call answered: a pivot takes effect in QEMU before
    libvirt answers, and libvirtd restarting in between fails the call. The mark of ``interim``
    says a pivot is under way from just before it is asked for.

    libvirt's answer is checked against QEMU's image locks: QEMU holds the file it is on, and
    the copy's other file only while a job runs. A libvirtd that restarts while a pivot is in
    flight can lose it (libvirt 9.0, killed after waiting for the job: its XML then names the
    source while QEMU writes to the destination), or wait for ever for its end. Then the mark
    records what QEMU's locks say (or, if they say nothing, that the pivot's outcome is
    unknown) with ``libvirt_unsure``, an alarm asks for the guest to be stopped and started,
    and LibvirtSilent is raised: libvirt is not asked about this disk again, and the next start
    settles it from the mark."""
    requested = None
    try:
        block = lookup_guest().get_block_device(dev)
        copy(block, destination)
        _step('copied')
        mark(interim, source, pivoting=True)
        _step('pivoting')
        requested = time.monotonic()
        block.abort_job(async_=True, pivot=True)
        _step('pivot requested')
    except Exception:
        LOG.warning('The copy of %s onto %s failed', dev, destination, exc_info=True)
    try:
        where = current_file(lookup_guest, dev)
    except LibvirtSilent:
        where = None
    qemu = qemu_is_on(source, destination)
    if where in (source, destination) and qemu in (None, where):
        return where, (time.monotonic() - requested if requested else float('nan'))
    if qemu is not None:
        mark(interim, qemu, libvirt_unsure=True)
    else:
        mark(interim, source, pivoting=True, libvirt_unsure=True)
    LOG.error('ALARM: libvirt says %s of instance disk %s is on %s, QEMU\'s locks say %s: '
              'libvirt lost track of its pivot. Stop and start the guest: its start puts it on '
              'the file it was last on (docs/nova-driver.md)', dev, source,
              where or 'nothing', qemu or 'nothing sure')
    raise LibvirtSilent('libvirt names %s for %s; QEMU is on %s' % (where, dev, qemu))


def qemu_is_on(*files):
    """The one of ``files`` a running QEMU holds, None if it holds none or several."""
    held = [path for path in files if held_by_qemu(path)]
    return held[0] if len(held) == 1 else None


def copy(block, destination):
    """A shallow block copy of the disk into ``destination`` (a qcow2 over the same bytes as
    the current backing file), until it is ready to pivot."""
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


def current_file(lookup_guest, dev):
    """The file ``dev`` is on per libvirt's live XML once no block job is left on it: a pivot
    or cancellation under way is waited for, a copy whose pivot was not asked for (or not
    taken) is cancelled. Asks again, on new connections, until libvirt answers; raises
    LibvirtSilent after LIBVIRT_ANSWER_SECONDS."""
    deadline = time.monotonic() + LIBVIRT_ANSWER_SECONDS
    cancelled = False
    while True:
        try:
            guest = lookup_guest()
            xml = guest.get_xml_desc()
            state = mirrors(xml).get(dev)
            if state is None:
                return {d: path for d, path, _ in qcow2_file_disks(xml)}.get(dev)
            if state not in ('pivot', 'abort') and not cancelled:
                LOG.warning('Cancelling the copy left on %s', dev)
                guest.get_block_device(dev).abort_job(async_=True)
                cancelled = True
        except Exception:
            LOG.debug('libvirt does not answer yet', exc_info=True)
        if time.monotonic() > deadline:
            raise LibvirtSilent('libvirt did not say in %ss where %s is'
                                % (LIBVIRT_ANSWER_SECONDS, dev))
        time.sleep(0.2)


class Watch:
    """A started guest waiting for its boot to be over, or for another try at its detach."""

    def __init__(self, instance_uuid, names, started):
        self.instance_uuid = instance_uuid
        self.names = names
        self.started = started
        self.window_seen = False
        self.failures = 0
        self.next_try = 0.0


class DetachFailed(Exception):
    """A detach that did not end with the guest's disks on ``_base``."""


class Detacher:
    """Watches started guests and detaches each once its boot is over, one at a time, on a
    thread of its own (a copy of a few megabytes, two pivots). A detach that fails is tried
    again RETRY_SECONDS later, then left to the guest's next start."""

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
            if now < watch.next_try or not boot_is_over(
                    status, watch.names, now - watch.started, self.settle_seconds,
                    self.max_seconds, watch.window_seen):
                continue
            # A base file being filled (docs/first-boot.md) is not in _base yet to move onto.
            if not all(os.path.exists(self.backing_files.base_path(name))
                       for name in watch.names):
                continue
            try:
                # Not while Nova works on the guest (a migration may take long): next round.
                if self.detach(uuid, wait=False) is None:
                    continue
            except DetachFailed:
                if watch.failures < len(RETRY_SECONDS):
                    watch.next_try = now + RETRY_SECONDS[watch.failures]
                    watch.failures += 1
                    continue
                LOG.error('Instance %s stays where it is until its next start: its detach '
                          'failed %d times', uuid, watch.failures + 1)
            del watched[uuid]

    def detach(self, instance_uuid, wait=True):
        """Moves every disk of the running guest that is on the mount to ``_base``, and
        finishes a detach left halfway (a disk on its interim file); returns
        [(dev, first pivot seconds, second pivot seconds)], or None if Nova holds the guest and
        ``wait`` is false. Raises DetachFailed (logged) if a disk is not on ``_base`` in the
        end: the guest runs on where it is."""
        guest_lock = lock(instance_uuid)
        if not guest_lock.acquire(blocking=wait):
            return None
        done = []
        try:
            lookup = functools.partial(self.lookup_guest, instance_uuid)
            guest = lookup()
            if guest is None or not guest.is_active():
                return done
            unsure = unsure_disks(guest.get_xml_desc())
            if unsure:
                raise LibvirtSilent('libvirt lost track of a pivot of %s: the guest must stop '
                                    'and start first' % ', '.join(unsure))
            xml = settle_jobs(lookup)
            reconcile(xml, running=True)
            for dev, path, name in disks_on_mount(xml, self.backing_files):
                base = self.backing_files.base_path(name)
                pivots = move_backing(lookup, dev, path, base)
                LOG.info('Detached %s (%s) from yolofs: now over %s; pivots %.1f and %.1f ms',
                         dev, path, base, pivots[0] * 1e3, pivots[1] * 1e3)
                done.append((dev,) + pivots)
            for dev, interim in disks_on_interim(xml):
                info = images.info(interim)
                second = move_back(lookup, dev, disk_of(interim), interim,
                                   info['backing-filename'],
                                   info.get('backing-filename-format', 'raw'),
                                   info['virtual-size'])
                LOG.info('Finished the detach of %s, left on %s', dev, interim)
                done.append((dev, float('nan'), second))
            self.detached[instance_uuid] = done
        except Exception as e:
            LOG.exception('Could not move instance %s off the yolofs mount', instance_uuid)
            raise DetachFailed(str(e)) from e
        finally:
            guest_lock.release()
        return done
