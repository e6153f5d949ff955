"""The first boot of an image on a host, before its download has finished (docs/first-boot.md).

When a base file is not cached yet and its image has a trusted published boot image, the driver
creates a *fill file* (``_base/NAME.yolo-fill``, sparse, at the base file's final size), has
yolofs serve it on its mount from the boot image at once, creates the instance disk over it and
starts the guest, while a thread of its own fills the file under Nova's lock of the base file:

* images stored raw in Glance are downloaded in order, and the ranges reads wait for (yolofs'
  ``fill_wants``) are fetched ahead with HTTP ``Range`` requests on Glance's image download;
  while guests boot over the file, the in-order download is paced (:class:`Pacer`);
* other formats go through Nova's own ``fetch_to_raw`` (download, inspection, conversion), and
  are copied into the fill file as they are; meanwhile, the clusters of a qcow2 image that reads
  wait for are found and fetched by range (``qcow2_ranges``).

A range fetched ahead is compared with the verified data (the in-order download's, the
conversion's) before it is overwritten: a mismatch fails the fill.

Each range written is reported to yolofs (``fill_done``), which wakes the reads waiting for it.
Once complete, the data is verified as Nova verifies a download, yolofs compares the boot image
with it (``fill_end``), and the fill file is renamed to the base file: the same inode, which
yolofs and QEMU keep reading. Any failure fails the fill (yolofs then fails the reads still
waiting, never serving a wrong byte) and deletes the fill file: ``_base`` never keeps a partial
file; the guests started over it are then failed as a failed download fails a normal boot
(``FirstBoots.on_failed``, the driver's).
"""

import contextlib
import errno
import fcntl
import hashlib
import logging as std_logging
import os
import threading
import time

from keystoneauth1 import exceptions as ks_exceptions
from oslo_concurrency import lockutils
from oslo_log import log as logging
from oslo_utils import fileutils
import requests
import tenacity

from yolo_common import images as yolo_images
from yolo_common import yolofs
from yolo_nova.virt import boot_images as boot_images_mod
from yolo_nova.virt import qcow2_ranges
from yolo_nova.virt import transfers

LOG = logging.getLogger(__name__)

FILL_SUFFIX = '.yolo-fill'
CHUNK_BYTES = 4 << 20          # written, hashed and reported to yolofs at a time
RANGE_ALIGN = 1 << 20          # a range a read waits for is fetched rounded out to this
WANTS_POLL_SECONDS = 2.0       # fill_wants' long poll
# The in-order download pauses while ranges a guest waits for are fetched (they get the link),
# for at most this long at a time.
WANTS_PRIORITY_SECONDS = 30.0
# The in-order download and its conversion run at this niceness: the guests they serve come
# first for the CPU (on the all-in-one's 2 cores, a raw image's 2 GiB at 1 Gbit/s took the TCG
# guest's CPU and made its first boot 1.36x a cached one). Ranges reads wait for keep the
# caller's priority.
FILL_NICENESS = 10
SPARSE_BLOCK = 4096            # blocks of zeros are left as holes
ZERO_BLOCK = bytes(SPARSE_BLOCK)
# A download that breaks (Glance restarted, a network blip) resumes where it broke, a few times.
DOWNLOAD_ATTEMPTS = 5
DOWNLOAD_ERRORS = (requests.RequestException, ks_exceptions.ConnectionError,
                   ks_exceptions.ServiceUnavailable, ks_exceptions.BadGateway,
                   ks_exceptions.GatewayTimeout)
# Glance's answers: connecting, and the longest wait for the next bytes. A stalled download
# is then resumed (DOWNLOAD_ATTEMPTS) or fails the fill: no fill, and no wait for one, lasts
# for ever.
CONNECT_TIMEOUT_SECONDS = 30
READ_TIMEOUT_SECONDS = 120
# A fill starts only once it holds Nova's lock of the base file; Nova holds it while it
# downloads the image itself (or its image cache manager looks at the file): past this wait,
# the boot takes Nova's path, which waits for Nova's download.
NOVA_LOCK_WAIT_SECONDS = 10


class Pacer:
    """Holds the in-order download to ``rate`` bytes a second for ``seconds`` after each guest
    starts over the fill: the guest needs nothing from it (the boot image covers its boot, and
    a range it waits for is fetched ahead at once), while moving the data at the link's rate
    takes CPU and memory bandwidth from it (Glance's sending, the checksum, the writes). A rate
    of 0: never paced."""

    def __init__(self, rate=0, seconds=0.0, clock=time.monotonic, sleep=time.sleep):
        self.rate = rate
        self.seconds = seconds
        self._clock = clock
        self._sleep = sleep
        self._until = self._next = clock()
        # The bytes that arrived while not paced, and the time they took: the link's rate.
        self.unpaced_bytes = 0
        self.unpaced_seconds = 0.0
        self._last = None

    @property
    def pacing(self):
        return bool(self.rate) and self._clock() < self._until

    def interrupted(self):
        """The download paused (a retry, ranges fetched first): the next chunk's time is not
        the link's."""
        self._last = None

    def guest_started(self):
        if not self.rate:
            return
        now = self._clock()
        if not self.pacing:
            self._next = now
        self._until = max(self._until, now + self.seconds)

    def took(self, length):
        """After ``length`` bytes of the download: waits until they fit the rate, if paced."""
        now = self._clock()
        if not self.pacing:
            if self._last is not None:
                self.unpaced_bytes += length
                self.unpaced_seconds += now - self._last
            self._next = self._last = now
            return
        # When the bytes so far may have arrived at the rate; a link slower than it builds
        # no credit.
        due = self._next + length / self.rate
        self._next = max(due, now)
        if due > now:
            self._sleep(min(due, self._until) - now)
        self._last = self._clock()


class FillFailed(Exception):
    """The fill could not be completed: its data is not the image's, or did not arrive."""


def fill_name(name):
    return name + FILL_SUFFIX


def base_name_of(backing_name):
    """The base file name a backing file name stands for: a fill file's is its base file's."""
    if backing_name.endswith(FILL_SUFFIX):
        return backing_name[:-len(FILL_SUFFIX)]
    return backing_name


class GlanceData:
    """An image's data in Glance, in order or by range: its download (``GET
    /v2/images/ID/file``), whose single ``Range`` requests Glance honours. glanceclient has no
    ranged call, so its keystoneauth session is used directly (``session``, ``auth``: as Nova's
    image API makes them for the booting user)."""

    def __init__(self, session, endpoint, image_id, auth=None):
        self.session = session
        self.auth = auth
        # The catalogue's endpoint, or one already versioned (openstacksdk's, say).
        root = endpoint.rstrip('/')
        root = root[:-len('/v2')] if root.endswith('/v2') else root
        self.url = '%s/v2/images/%s/file' % (root, image_id)

    @classmethod
    def for_context(cls, context, image_id):
        """As Nova's own download would see it: the user's token, Nova's Glance endpoint."""
        from nova.image import glance
        session, auth = glance._session_and_auth(context)
        return cls(session, glance.generate_glance_url(context), image_id, auth=auth)

    def _get(self, start=None, end=None):
        """The download, or the single range from byte ``start`` to ``end`` (included; None:
        to the end of the image) of it."""
        headers = {}
        if start is not None:
            headers['Range'] = 'bytes=%d-%s' % (start, '' if end is None else end)
        response = self.session.get(self.url, auth=self.auth, headers=headers, stream=True,
                                    raise_exc=True,
                                    timeout=(CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS))
        if start is not None:
            try:
                check_content_range(response, start, end)
            except FillFailed:
                response.close()
                raise
        return response

    def chunks(self, start=0, chunk_bytes=CHUNK_BYTES):
        """The data from byte ``start`` on, in order."""
        response = self._get(start if start else None)
        try:
            yield from response.iter_content(chunk_bytes)
        finally:
            response.close()

    def read(self, offset, length):
        """Exactly ``length`` bytes at ``offset``."""
        response = self._get(offset, offset + length - 1)
        try:
            data = response.content
        finally:
            response.close()
        if len(data) != length:
            raise FillFailed('Glance sent %d bytes for a range of %d' % (len(data), length))
        return data


def check_content_range(response, start, end):
    """Raises FillFailed unless ``response`` is the 206 of bytes ``start``-``end`` (None:
    to the end) that was asked for: a server that ignores ranges answers 200 with the whole
    image, and a proxy or a store could answer with other bytes than those asked for."""
    if response.status_code != 206:
        raise FillFailed('Glance answered a range request with HTTP %s' % response.status_code)
    content_range = response.headers.get('Content-Range', '')
    unit, _, spec = content_range.partition(' ')
    first, _, rest = spec.partition('-')
    last = rest.partition('/')[0]
    try:
        sent = (int(first), int(last))
    except ValueError:
        raise FillFailed('Glance answered a range request with Content-Range %r'
                         % content_range) from None
    if unit != 'bytes' or sent[0] != start or (end is not None and sent[1] != end):
        raise FillFailed('Glance sent bytes %d-%d for a request of %d-%s'
                         % (sent[0], sent[1], start, '' if end is None else end))


class Fill:
    """One base file being filled while guests may already read it through yolofs.

    ``client``: yolofs' control client. ``boot_image_path``: the boot image yolofs serves the
    fill file from, kept for the fill's life: a yolofs restarted meanwhile (its fills are not
    kept) is asked to serve the fill again. :meth:`begin` creates the fill file and registers it;
    :meth:`run_raw` or :meth:`run_converted` fills it, on the caller's thread; the outcome is
    then ``complete`` (renamed to the base file; ``boot_image_matches`` says what yolofs found;
    ``after_complete(fill)`` has run) or ``failed`` (deleted), and :meth:`wait` returns.
    ``disks``: the instance disks made over the fill file (:meth:`add_disk`). ``pacer``: how
    the in-order download yields to the guests booting over them.
    """
    after_complete = None
    # Called when the fill fails outside its run (its run may wait for a download for long).
    after_failed_elsewhere = None
    # The host's transfers (virt/transfers.py), which an in-order download's rate joins.
    transfers = None

    def __init__(self, base_dir, name, size, client, image_id, boot_image_id, boot_image_path,
                 pacer=None):
        self.name = name
        self.size = size
        self.client = client
        self.image_id = image_id
        self.boot_image_id = boot_image_id
        self.boot_image_path = boot_image_path
        self.file = fill_name(name)
        self.path = os.path.join(base_dir, self.file)
        self.base_path = os.path.join(base_dir, name)
        self.outcome = None
        self.reason = None
        self.boot_image_matches = None
        self.disks = set()
        self.guests_stopped = False
        self.pacer = pacer or Pacer()
        self._ended = threading.Event()
        # Set once the fill holds Nova's lock and yolofs serves its file, or has ended.
        self.started = threading.Event()
        # Bytes below it are written by the in-order download, whose checksum is verified:
        # a range fetched for a waiting read is written only above it (see _serve_wants).
        self._cursor = 0
        # The digest of the data written in order (``checksum``'s algorithm, or SHA-256): the
        # file as written must read back to it.
        self.algorithm = 'sha256'
        self._stream = None
        # Under it: the cursor, the writes, and the ranges fetched ahead (registered before
        # they are written, compared with the in-order data that reaches them).
        self._write_lock = threading.Lock()
        self._no_wants = threading.Event()
        self._no_wants.set()
        self._ahead = []
        # Ranges written ahead as reported to yolofs: one reporter at a time.
        self._ahead_written = []
        self._report_lock = threading.RLock()
        # Held open, and locked, for the fill's life (see begin).
        self._owner_fd = None
        # Set once the fill ends: no report reaches yolofs after its end.
        self._closing = False
        # What reads waited for: ranges fetched on demand, their bytes and the seconds spent.
        self.fetched_ranges = self.fetched_bytes = 0
        self.fetch_seconds = 0.0
        # Set when Glance refused a range for an expired token.
        self.ranges_unauthorized = False

    def wait(self, timeout=None):
        """Whether the fill has ended within ``timeout`` seconds."""
        return self._ended.wait(timeout)

    @property
    def running(self):
        return not self._ended.is_set()

    def add_disk(self, path):
        """Instance disk ``path`` is over the fill file: its guest starts."""
        self.disks.add(path)
        self.pacer.guest_started()

    def begin(self):
        """Creates the fill file, sparse, at its final size, and has yolofs serve it. The fill
        file stays open and locked (flock, which NFS carries to its server) until the fill ends:
        a nova-compute that starts meanwhile, on this host or another sharing ``_base``, sees a
        fill under way, not one left behind (FirstBoots.abandon_leftovers)."""
        # What yolofs is asked to serve, as verified: a yolofs restarted mid-fill is asked
        # again only if the file still is (_serve_again).
        self._boot_image_state = (os.stat(self.boot_image_path),
                                  boot_image_digest(self.boot_image_path))
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self._owner_fd = fd
        # Blocking: another host's check of the new file (filled_elsewhere) holds it a moment.
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, self.size)
        os.fchmod(fd, 0o644)
        if not self.client.fill_begin(self.file, self.boot_image_path, self.image_id).new:
            # A fill of that name yolofs was never told the end of (it did not answer then):
            # ended now, so that nothing it held counts for this one.
            self.client.fill_end(self.file, complete=False, reason='a new fill of the file')
            if not self.client.fill_begin(self.file, self.boot_image_path, self.image_id).new:
                raise FillFailed('yolofs serves another fill of %s' % self.file)

    def run_raw(self, data, checksum=None, inspect=None):
        """Fills from ``data`` (a :class:`GlanceData` of a raw image): in order, with the
        ranges reads wait for fetched ahead. ``checksum``: (hashlib algorithm, hex digest) the
        whole must match; ``inspect(path)`` raises if the complete file is not acceptable."""
        if checksum:
            self.algorithm = checksum[0]

        def write_all(fd):
            self._download(fd, data)
            if self.transfers is not None:
                self.transfers.record(transfers.DOWNLOAD, self.pacer.unpaced_bytes,
                                      self.pacer.unpaced_seconds)
            if self._cursor != self.size:
                raise FillFailed('Glance sent %d of the image\'s %d bytes'
                                 % (self._cursor, self.size))
            if checksum and self._stream.hexdigest() != checksum[1]:
                raise FillFailed('the data does not match the image\'s %s checksum'
                                 % checksum[0])
        self._run(write_all, inspect, self._wants_thread(data))

    def run_converted(self, produce_raw, inspect=None, ranges=None):
        """Fills from the raw file ``produce_raw(path)`` writes (Nova's ``fetch_to_raw``, which
        verifies the download and inspects and converts it), copied in as it is. ``ranges``: the
        disk's data by range meanwhile (a ``qcow2_ranges.Qcow2Data``), for the reads that wait."""
        self._run(lambda fd: self._copy_converted(fd, produce_raw), inspect,
                  self._wants_thread(ranges))

    def _wants_thread(self, source):
        """The thread that, while the fill runs, keeps yolofs serving it and fetches from
        ``source`` (``read(offset, length)``; None: none) what reads wait for."""
        return threading.Thread(target=self._serve_wants, args=(source,),
                                name='yolo-fill-wants-%s' % self.name, daemon=True)

    def abandon(self, reason):
        """Ends a fill yolofs was never asked to serve: its fill file goes, if made."""
        self._end_failed(reason, registered=False)

    def fail(self, reason):
        """Ends a fill that did not run to its end (an error before it ran, say)."""
        with self._report_lock:
            if self.running:
                self._end_failed(reason)

    def _run(self, write_all, inspect, helper):
        try:
            self._stream = hashlib.new(self.algorithm)
            fd = os.open(self.path, os.O_RDWR)
            written = os.fstat(fd).st_ino
            try:
                if helper is not None:
                    helper.start()     # before the renice, which threads started after inherit
                in_background()
                write_all(fd)
                os.fsync(fd)
                # A write the kernel took short or lost: the file, read back, is the data.
                with self._write_lock:
                    if yolo_images.file_digest(fd, self.algorithm) != self._stream.hexdigest():
                        raise FillFailed('the file as written is not the data received')
            finally:
                os.close(fd)
            if inspect is not None:
                inspect(self.path)
            with self._report_lock:
                # Ended meanwhile (on another thread), or the file is no longer this fill's.
                if not self.running:
                    raise FillFailed('the fill was ended: %s' % self.reason)
                if os.stat(self.path).st_ino != written:
                    raise FillFailed('the fill file is not the one written')
                self._closing = True
            self.boot_image_matches = self._end_complete()
            os.rename(self.path, self.base_path)
        except Exception as e:
            LOG.exception('Filling base file %s of image %s failed', self.name, self.image_id)
            self.fail(str(e) or type(e).__name__)
            return
        self._release()
        self.outcome = 'complete'
        LOG.info('Filled base file %s of image %s (%d bytes; %d ranges, %d bytes, fetched on '
                 'demand in %.1f s)', self.name, self.image_id, self.size, self.fetched_ranges,
                 self.fetched_bytes, self.fetch_seconds)
        try:
            if self.after_complete is not None:
                self.after_complete(self)
        except Exception:
            LOG.exception('After filling base file %s', self.name)
        fileutils.delete_if_exists(self.boot_image_path)
        self._ended.set()

    def _end_complete(self):
        """Tells yolofs the data is complete and verified; whether the boot image it served
        matches it (None: yolofs could not say; the base file stands, verified)."""
        try:
            answer = self.client.fill_end(self.file, complete=True)
        except (OSError, ValueError, yolofs.YolofsError) as e:
            LOG.warning('yolofs did not take the end of fill %s (%s): its boot image is '
                        'compared with the base file when installed', self.file, e)
            return None
        if answer.boot_image_matches is False:
            # yolofs has logged the alarm and counted it; the data is Glance's, verified: the
            # base file is good, only the boot image was wrong.
            LOG.error('ALARM: the boot image of base file %s (image %s) did not match the '
                      'complete data: it is quarantined', self.name, self.image_id)
            return False
        return True

    def _end_failed(self, reason, registered=True):
        self.outcome, self.reason = 'failed', reason
        with self._report_lock:
            self._closing = True    # nothing more is reported to yolofs, or registered again
        if registered:
            try:
                self.client.fill_end(self.file, complete=False, reason=reason[:500])
            except (OSError, ValueError, yolofs.YolofsError) as e:
                LOG.warning('yolofs did not take the end of fill %s: %s', self.file, e)
        # Only a fill file this fill made: one there before it (another host's, on a shared
        # _base) is not its own to delete.
        if self._owner_fd is not None:
            fileutils.delete_if_exists(self.path)
        self._release()
        fileutils.delete_if_exists(self.boot_image_path)
        self._ended.set()

    def _release(self):
        if self._owner_fd is not None:
            os.close(self._owner_fd)    # and its lock
            self._owner_fd = None

    def _written(self, offset, length, ahead=False):
        """Reports bytes final to yolofs. A yolofs that has no fill of the file (restarted
        since) serves it again, told every range written so far; one that does not answer
        is told with the next report: the download goes on either way."""
        with self._report_lock:
            if self._closing:
                return
            if ahead:
                self._ahead_written.append((offset, length))
            try:
                self.client.fill_done(self.file, offset, length)
            except yolofs.YolofsError as e:
                if not self._serve_again():
                    LOG.warning('yolofs did not take a range of fill %s: %s', self.file, e)
            except (OSError, ValueError) as e:
                LOG.debug('yolofs did not take a range of fill %s: %s', self.file, e)

    def _boot_image_unchanged(self):
        """Whether the boot image file is the one verified (hashed again only if its
        status changed since the last look)."""
        try:
            now = os.stat(self.boot_image_path)
            seen, digest = self._boot_image_state
            if (now.st_ino, now.st_size, now.st_mtime_ns, now.st_ctime_ns) == (
                    seen.st_ino, seen.st_size, seen.st_mtime_ns, seen.st_ctime_ns):
                return True
            return boot_image_digest(self.boot_image_path) == digest
        except OSError:
            return False

    def _serve_again(self):
        """Has a yolofs without the fill (restarted since) serve it again, told every range
        written so far; whether it had none."""
        with self._report_lock:
            if self._closing:
                return False
            if not self._boot_image_unchanged():
                kept = self.boot_image_path + '.changed'
                with contextlib.suppress(OSError):
                    os.replace(self.boot_image_path, kept)
                LOG.error('ALARM: the boot image file of fill %s changed since it was verified '
                          '(kept as %s); yolofs, restarted, is not asked to serve it: the fill '
                          'fails and its guests are stopped', self.file, kept)
                self.fail('its boot image file changed while yolofs restarted')
                if self.after_failed_elsewhere is not None:
                    threading.Thread(target=self.after_failed_elsewhere, args=(self,),
                                     daemon=True).start()
                return False
            try:
                if not self.client.fill_begin(self.file, self.boot_image_path,
                                              self.image_id).new:
                    return False
                LOG.warning('yolofs serves fill %s again (it was restarted)', self.file)
                for done in [(0, self._cursor)] + self._ahead_written:
                    if done[1]:
                        self.client.fill_done(self.file, *done)
            except (OSError, ValueError, yolofs.YolofsError) as e:
                LOG.debug('yolofs did not take fill %s again yet: %s', self.file, e)
                return False
            return True

    @tenacity.retry(retry=tenacity.retry_if_exception_type(DOWNLOAD_ERRORS),
                    stop=tenacity.stop_after_attempt(DOWNLOAD_ATTEMPTS),
                    wait=tenacity.wait_exponential(multiplier=2, max=30), reraise=True,
                    before_sleep=tenacity.before_sleep_log(LOG, std_logging.WARNING))
    def _download(self, fd, data):
        """The in-order download from the cursor on: a broken one is resumed there."""
        self.pacer.interrupted()
        for chunk in data.chunks(self._cursor):
            # Not read on while a guest's ranges are fetched: TCP then holds this stream back.
            if not self._no_wants.is_set():
                self._no_wants.wait(WANTS_PRIORITY_SECONDS)
                self.pacer.interrupted()
            if self._cursor + len(chunk) > self.size:
                raise FillFailed('Glance sent more than the image\'s %d bytes' % self.size)
            self._write_in_order(fd, chunk)
            self.pacer.took(len(chunk))

    def _write_in_order(self, fd, chunk):
        """Writes ``chunk`` at the cursor, moves the cursor past it and reports it."""
        if not self.running:
            raise FillFailed('the fill was ended: %s' % self.reason)
        with self._write_lock:
            self._check_ahead(fd, chunk, self._cursor)
            write_data(fd, chunk, self._cursor)
            self._stream.update(chunk)
            offset, self._cursor = self._cursor, self._cursor + len(chunk)
        self._written(offset, len(chunk))

    def _check_ahead(self, fd, chunk, offset):
        """Fails the fill if a range fetched ahead, which a guest may have read, is not what
        the verified data at ``offset`` says."""
        end = offset + len(chunk)
        for ahead_offset, ahead_length in self._ahead:
            start, stop = max(offset, ahead_offset), min(end, ahead_offset + ahead_length)
            if start < stop and os.pread(fd, stop - start, start) != chunk[
                    start - offset:stop - offset]:
                raise FillFailed('the bytes %d-%d fetched by range for a read are not the '
                                 'image\'s' % (start, stop - 1))

    def _serve_wants(self, data):
        """While the fill runs: asks yolofs what reads wait for, every WANTS_POLL_SECONDS at
        most, and fetches it from ``data`` (None: reads wait for the data in order). A yolofs
        that has no fill of the file (restarted since: reads of it wait for it) is told it again
        at once, with every range written so far. A failure to fetch only leaves the reads
        waiting for the data in order."""
        fd = None
        try:
            if data is not None:
                fd = os.open(self.path, os.O_WRONLY)
            while self.running and self._cursor < self.size:
                try:
                    wants = self.client.fill_wants(self.file, WANTS_POLL_SECONDS)
                except yolofs.YolofsError:
                    if not self._serve_again():
                        time.sleep(WANTS_POLL_SECONDS)
                    continue
                except (OSError, ValueError):
                    time.sleep(WANTS_POLL_SECONDS)    # yolofs restarting
                    continue
                if data is None:
                    if wants:
                        time.sleep(WANTS_POLL_SECONDS)
                    continue
                data = self._fetch_wants(fd, data, wants)
        except Exception:
            LOG.exception('Keeping yolofs serving fill %s stopped', self.file)
        finally:
            if fd is not None:
                os.close(fd)

    def _fetch_wants(self, fd, data, wants):
        """Fetches ``wants`` from ``data``; returns the source of the next ones (None once
        fetching has failed: the reads then wait for the data in order)."""
        self._no_wants.clear()
        try:
            for offset, length in wants:
                self._fetch_ahead(fd, data, offset, length)
        except qcow2_ranges.Unsupported as e:
            LOG.warning('Reads of base file %s outside its boot image wait for the conversion '
                        'of image %s: %s', self.name, self.image_id, e)
            return None
        except ks_exceptions.Unauthorized:
            # The booting user's token expired mid-fill, and Glance had no service token to
            # accept it with: the download in order goes on over its open connection.
            self.ranges_unauthorized = True
            LOG.warning("Glance refused a range of base file %s (image %s) with 401: the "
                        "booting user's token has expired. Its reads wait for the download in "
                        "order; with [service_user] send_service_user_token = true, Glance "
                        "accepts an expired user token beside Nova's service token",
                        self.name, self.image_id)
            return None
        except Exception:
            LOG.exception('Fetching ranges of base file %s by request stopped; its reads wait '
                          'for the download in order', self.name)
            return None
        finally:
            self._no_wants.set()
        return data

    def _fetch_ahead(self, fd, data, offset, length):
        start = max(offset - offset % RANGE_ALIGN, self._cursor)
        end = min(self.size, -(-(offset + length) // RANGE_ALIGN) * RANGE_ALIGN)
        if start >= end:
            return
        started = time.monotonic()
        chunk = data.read(start, end - start)
        self.fetched_ranges += 1
        self.fetched_bytes += len(chunk)
        self.fetch_seconds += time.monotonic() - started
        with self._write_lock:
            # The in-order download may have passed it meanwhile: it wrote the same bytes,
            # verified; they are not overwritten. Registered before it is written: the
            # in-order data that reaches it compares whatever of it is in the file.
            if not self.running:
                return
            start_now = max(start, self._cursor)
            if start_now < end:
                registered = (start_now, end - start_now)
                self._ahead.append(registered)
                try:
                    write_data(fd, chunk[start_now - start:], start_now)
                except OSError:
                    # What it wrote, if anything, the read-back of the whole file compares.
                    self._ahead.remove(registered)
                    raise
        if start_now < end:
            self._written(start_now, end - start_now, ahead=True)

    def _copy_converted(self, fd, produce_raw):
        converted = self.path + '.download'
        try:
            produce_raw(converted)
            size = os.path.getsize(converted)
            if size != self.size:
                raise FillFailed('the image converts to %d bytes, not %d' % (size, self.size))
            with open(converted, 'rb') as source:
                while True:
                    chunk = source.read(CHUNK_BYTES)
                    if not chunk:
                        break
                    self._write_in_order(fd, chunk)
        finally:
            for leftover in (converted, converted + '.part', converted + '.converted'):
                fileutils.delete_if_exists(leftover)


def boot_image_digest(path):
    with open(path, 'rb') as f:
        return yolo_images.file_digest(f.fileno(), 'sha256')


def in_background():
    """Lowers the calling thread's CPU priority to FILL_NICENESS (Linux sets a niceness per
    thread, and children it starts inherit it: Nova's qemu-img convert). Not on a process's main
    thread, which under eventlet is every green thread of nova-compute. Whether it did."""
    thread = threading.get_native_id()
    if thread == os.getpid():
        return False
    try:
        niceness = os.getpriority(os.PRIO_PROCESS, thread)
        if niceness < FILL_NICENESS:
            os.setpriority(os.PRIO_PROCESS, thread, FILL_NICENESS)
    except OSError as e:
        LOG.debug('The fill keeps its CPU priority: %s', e)
        return False
    return True


def pwrite_all(fd, data, offset):
    """Writes all of ``data`` at ``offset``, or raises: a write the kernel takes short (the
    disk filling up) is carried on, and then fails with the reason."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        if written == 0:
            raise OSError(errno.EIO, 'a write of %d bytes at %d wrote nothing'
                          % (len(view), offset))
        view, offset = view[written:], offset + written


def write_data(fd, chunk, offset):
    """Writes ``chunk`` at ``offset`` of the fill file but for its blocks of zeros: the fill
    file is sparse, its holes read as zeros already, and the base file stays as sparse as the one
    Nova's conversion writes (qemu-img skips 4 KiB blocks of zeros).

    Blocks are compared as bytes (memcmp): a memoryview compares byte by byte, which cost a
    fill 2.7 s of CPU per GiB, taken from the guest it serves."""
    chunk = bytes(chunk)
    tail = len(chunk) % SPARSE_BLOCK
    if ZERO_BLOCK not in chunk and not (tail and chunk[-tail:] == ZERO_BLOCK[:tail]):
        pwrite_all(fd, chunk, offset)  # no block of zeros: most chunks of an image's data
        return
    view = memoryview(chunk)
    run_start = None
    for start in range(0, len(chunk), SPARSE_BLOCK):
        zero = chunk[start:start + SPARSE_BLOCK] == ZERO_BLOCK[:len(chunk) - start]
        if not zero and run_start is None:
            run_start = start
        elif zero and run_start is not None:
            pwrite_all(fd, view[run_start:start], offset + run_start)
            run_start = None
    if run_start is not None:
        pwrite_all(fd, view[run_start:], offset + run_start)


def glance_image(context, image_id):
    """Glance's own record of the image (Nova's image API leaves out ``virtual_size``), read
    with the booting user's token as Nova's image API reads it."""
    from nova.image import glance
    return dict(glance.GlanceClientWrapper().call(context, 2, 'get', args=(image_id,)))


def inspect_raw(image, image_id, path):
    """Nova's checks of a downloaded raw image (``images.fetch_to_raw``: deep inspection, then
    qemu-img's view: raw, no backing file, no data file), on the complete fill file."""
    import nova.conf
    from nova.virt import images
    fmt = None
    if not nova.conf.CONF.workarounds.disable_deep_image_inspection:
        fmt = images.do_image_deep_inspection(image, image_id, path)
    info = images.qemu_img_info(path, format='raw' if fmt is None else None)
    if info.file_format != 'raw' or (fmt is not None and fmt != 'raw'):
        raise FillFailed('the data is %s, not raw' % (fmt or info.file_format))
    if info.backing_file is not None:
        raise FillFailed('the data has a backing file')


def filled_elsewhere(path):
    """Whether fill file ``path`` is locked by a fill under way (Fill.begin)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)      # and the lock taken
    return False


def signature_checked_by_nova(image, trusted_certs=None):
    """Whether Nova's own download would check the image's signature: Nova verifies signatures
    (``[glance] verify_glance_signatures``), the server asks for trusted certificates (its own,
    or ``[glance] default_trusted_certificate_ids`` with ``enable_certificate_validation``), or
    the image is signed. Such a boot takes Nova's path, where the check is Nova's own (cursive,
    its key manager, the certificates), and refuses what Nova refuses."""
    import nova.conf
    conf = nova.conf.CONF.glance
    properties = image.get('properties') or {}
    return bool(
        conf.verify_glance_signatures or trusted_certs
        or (conf.enable_certificate_validation and conf.default_trusted_certificate_ids)
        or any(key.startswith('img_signature') for key in properties))


def image_checksum(image):
    """(algorithm, hex digest) the image's data must match, as Nova's download checks it:
    Glance's multihash, or for images uploaded before it the legacy MD5 ``checksum``."""
    if image.get('os_hash_algo') and image.get('os_hash_value'):
        return image['os_hash_algo'], image['os_hash_value']
    if image.get('checksum'):
        return 'md5', image['checksum']
    return None


class FirstBoots:
    """This host's fills, one per base file name: concurrent first boots of an image share one.

    ``lock_path``: the directory of Nova's external locks of base files (its image backend's
    ``lock_path``); a fill holds the base file's lock from its start to its end, as Nova's own
    download does, so Nova never fetches a base file being filled, nor the other way round.
    ``on_failed(fill)``, if set, is called after a fill over which disks were made has failed,
    ``on_mismatch(fill)`` after one whose boot image did not match the image's data has ended
    (``fill.reason`` says so). ``paced_rate``, ``paced_seconds``: the :class:`Pacer` of each
    raw image's download.
    """
    on_failed = None
    on_mismatch = None

    def __init__(self, backing_files, boot_images, lock_path, paced_rate=0, paced_seconds=0.0):
        self.backing_files = backing_files
        self.boot_images = boot_images
        self.base_dir = backing_files.base_dir
        self.client = backing_files.client
        self.lock_path = lock_path
        self.paced_rate = paced_rate
        self.paced_seconds = paced_seconds
        self._fills = {}
        self._lock = threading.Lock()
        # Fills that ended since the start whose ranges Glance refused for an expired token.
        self.fills_with_expired_tokens = 0
        # Images whose Glance store serves ranges (file, cinder) and those whose store does
        # not (rbd, swift, s3, http: Glance answers a range with 400), as probed.
        self._ranges = {}

    def running(self, name):
        """The running fill of base file ``name`` (or of its fill file's name), or None."""
        fill = self._fills.get(base_name_of(name))
        return fill if fill is not None and fill.running else None

    def begin(self, context, image_id, base_path, disk_size, trusted_certs=None):
        """Starts (or joins) the fill of the base file of Glance image ``image_id`` if it can
        be booted before its download: yolofs is healthy, Glance publishes a boot image to use,
        the image's size is known and fits ``disk_size``, and Nova would not check its
        signature (``trusted_certs``: the server's). Returns the fill, or None: Nova's normal
        path then downloads the image. Never raises."""
        name = os.path.basename(base_path)
        if trusted_certs:
            LOG.info('Image %s boots on Nova\'s path: the server asks for trusted '
                     'certificates', image_id)
            return None
        fill = self.running(name)
        if fill is not None or context is None or not image_id:
            return self._joined(fill)
        if self.backing_files.status() is None or self.boot_images.verifier is None:
            return None
        try:
            image = self.boot_images.image_api.get(context, image_id)
            if signature_checked_by_nova(image):
                LOG.info('Image %s boots once downloaded: Nova verifies its signature',
                         image_id)
                return None
            raw = image.get('disk_format') == 'raw'
            size = image.get('size') if raw else glance_image(context, image_id).get('virtual_size')
            # Too small a flavor disk: Nova's normal path raises the error it always raises.
            if not size or (disk_size and size > disk_size):
                return None
            checksum = image_checksum(image) if raw else None
            if checksum and checksum[0] not in hashlib.algorithms_available:
                LOG.warning('Image %s boots once downloaded: its %s checksum cannot be '
                            'computed here', image_id, checksum[0])
                return None
            data = GlanceData.for_context(context, image_id)
            if not self._room_for(image, size, raw) or not self._serves_ranges(image_id, data):
                return None
            boot_image = self.boot_images.trusted_boot_image(context, image_id, image)
            if boot_image is None:
                return None
            boot_image_id = boot_image['id']
            boot_image_path = self.boot_images.download(context, name, boot_image, image_id)
        except boot_images_mod.Untrusted:
            return None
        except Exception:
            LOG.exception('Not booting image %s before its download', image_id)
            return None
        if raw:
            def run(fill):
                fill.run_raw(data, checksum,
                             inspect=lambda path: inspect_raw(image, image_id, path))
        else:
            ranges = None
            if image.get('disk_format') == 'qcow2' and image.get('size'):
                ranges = qcow2_ranges.Qcow2Data(data, image['size'])

            def run(fill):
                from nova.virt import images
                fill.run_converted(lambda path: images.fetch_to_raw(context, image_id, path),
                                   ranges=ranges)
        # The boot image file is the fill's from now on (it deletes it when it ends); one
        # that joined another fill is not used.
        return self._joined(
            self._start(name, size, image_id, boot_image_id, boot_image_path, run))

    @property
    def images_without_ranges(self):
        return sorted(image_id for image_id, ranges in self._ranges.items() if not ranges)

    def _serves_ranges(self, image_id, data):
        """Whether Glance serves the image's data (``data``, a :class:`GlanceData`) by range,
        asked once per image with a range of one byte. Without ranges, reads outside the boot
        image could only wait for the whole download in order, a broken download could not
        resume, and a qcow2 image's tables could not be read before its conversion: the boot
        takes Nova's path."""
        if image_id not in self._ranges:
            try:
                data.read(0, 1)
                self._ranges[image_id] = True
            except (FillFailed, ks_exceptions.BadRequest,
                    ks_exceptions.RequestedRangeNotSatisfiable) as e:
                self._ranges[image_id] = False
                LOG.warning('Glance does not serve image %s by range (%s; its store is not '
                            'file or cinder): it boots once downloaded, on Nova\'s path',
                            image_id, e)
        return self._ranges[image_id]

    def _room_for(self, image, size, raw):
        """Whether ``_base`` has room for the fill: the raw image (``size`` bytes); for other
        formats also Nova's download and conversion, which a fill holds beside its file (Nova's
        own path holds those two only). Where it has not, Nova's path is taken."""
        needed = size if raw else 2 * size + (image.get('size') or 0)
        stat = os.statvfs(self.base_dir)
        free = stat.f_bavail * stat.f_frsize
        if free >= needed:
            return True
        LOG.warning('Image %s boots once downloaded: its first boot before the download would '
                    'need %d MiB free in %s, which has %d MiB', image.get('id'), needed >> 20,
                    self.base_dir, free >> 20)
        return False

    def start(self, name, size, image_id, boot_image_id, boot_image_path, run):
        """Starts filling base file ``name`` (``size`` bytes) with ``run(fill)`` on a thread of
        its own, served meanwhile from boot image ``boot_image_id`` at ``boot_image_path`` (the fill
        deletes when it ends). Returns the fill once yolofs serves its file (the one under way
        if there is one), or None (the base file is there by now, Nova is downloading it, yolofs
        refused the boot image...): the caller then takes Nova's normal path. Other images'
        first boots never wait for this one's start."""
        return self._joined(
            self._start(name, size, image_id, boot_image_id, boot_image_path, run))

    def _start(self, name, size, image_id, boot_image_id, boot_image_path, run):
        """The fill of ``name``: a new one, which owns ``boot_image_path`` from now on, or the one
        under way (``boot_image_path`` is then deleted, unless it is that fill's)."""
        with self._lock:
            fill = self.running(name)
            if fill is None:
                fill = Fill(self.base_dir, name, size, self.client, image_id, boot_image_id,
                            boot_image_path, Pacer(self.paced_rate, self.paced_seconds))
                fill.after_complete = self._keep_boot_image
                fill.after_failed_elsewhere = self._stop_guests
                fill.transfers = self.backing_files.transfers
                try:
                    threading.Thread(target=self._fill, args=(fill, run),
                                     name='yolo-fill-%s' % name, daemon=True).start()
                except RuntimeError as e:     # no thread to be had: Nova's path
                    LOG.error('Could not start the fill of base file %s: %s', name, e)
                    fill.abandon('its thread could not start')
                    return None
                self._fills[name] = fill
                return fill
        if fill.boot_image_path != boot_image_path:
            fileutils.delete_if_exists(boot_image_path)
        return fill

    @staticmethod
    def _joined(fill):
        """``fill`` once it has started, if it runs."""
        if fill is None:
            return None
        # Bounded by the wait for Nova's lock and yolofs' control timeout, with room to spare.
        if not fill.started.wait(NOVA_LOCK_WAIT_SECONDS + 60):
            LOG.warning('The fill of base file %s has not started; Nova\'s path is taken',
                        fill.name)
            return None
        return fill if fill.running else None

    def _fill(self, fill, run):
        try:
            self._fill_locked(fill, run)
        except Exception as e:
            # Whatever failed before the fill could run (Glance's endpoint, say) ends it.
            LOG.exception('The fill of base file %s failed', fill.name)
            fill.fail(str(e) or type(e).__name__)
        finally:
            fill.started.set()
        if fill.ranges_unauthorized:
            self.fills_with_expired_tokens += 1
        if not fill.disks:
            return
        if fill.outcome == 'failed':
            self._stop_guests(fill)
        elif fill.boot_image_matches is False and self.on_mismatch is not None:
            try:
                self.on_mismatch(fill)
            except Exception:
                LOG.exception('After the fill of base file %s', fill.name)

    def _stop_guests(self, fill):
        """on_failed for the guests over a failed fill, once (the fill may fail on another
        thread while its run still waits for a download)."""
        with self._lock:
            if fill.guests_stopped or not fill.disks or self.on_failed is None:
                return
            fill.guests_stopped = True
        try:
            self.on_failed(fill)
        except Exception:
            LOG.exception('After the failed fill of base file %s', fill.name)

    def _fill_locked(self, fill, run):
        # Nova's external lock of the base file, as its Image.cache takes it; held by Nova for
        # longer than a moment, Nova is downloading the file: its path is taken.
        deadline = time.monotonic() + NOVA_LOCK_WAIT_SECONDS
        while True:
            try:
                with lockutils.lock(fill.name, lock_file_prefix='nova-', external=True,
                                    lock_path=self.lock_path, blocking=False):
                    self._fill_under_novas_lock(fill, run)
                    return
            except lockutils.AcquireLockFailedException:
                if time.monotonic() > deadline:
                    fill.abandon('Nova holds the lock of the base file')
                    return
                time.sleep(0.2)

    def _fill_under_novas_lock(self, fill, run):
        try:
            if os.path.exists(fill.base_path):
                fill.abandon('the base file is there')
                return
            fill.begin()
        except Exception as e:
            LOG.warning('Not filling base file %s from its boot image: %s', fill.name, e)
            fill.abandon(str(e) or type(e).__name__)
            return
        fill.started.set()
        try:
            run(fill)
        finally:
            fill.fail('the fill stopped before its end')

    def _keep_boot_image(self, fill):
        """After a complete fill, the boot image is installed for the base file as any other
        (yolofs compares it with the data again). One that did not match served bytes the
        image does not hold: it is rejected (here and in Glance, for every host), and the
        guests started over the fill are failed (``on_mismatch``)."""
        if fill.boot_image_matches is False:
            fill.reason = ("its boot image %s did not match the image's data"
                           % fill.boot_image_id)
            self.boot_images.reject(fill.image_id, fill.boot_image_id, fill.reason)
            return
        self.boot_images.install_file(fill.name, fill.boot_image_path, fill.image_id,
                                      fill.boot_image_id)

    def abandon_leftovers(self):
        """Deletes the fill files (and converted downloads) a previous nova-compute left (it
        stopped mid-fill): yolofs fails their reads; the next start of a guest over one fills
        its base file again. A fill file still locked is another nova-compute's fill under way
        (a ``_base`` shared with other hosts): it and its download are left alone. Returns the
        names of the base files whose fills were deleted."""
        abandoned = set()
        for entry in os.listdir(self.base_dir):
            name, fill_suffix, _ = entry.partition(FILL_SUFFIX)
            if not fill_suffix or self.running(name) or filled_elsewhere(
                    os.path.join(self.base_dir, fill_name(name))):
                continue
            LOG.warning('Deleting %s, left by a fill that did not end', entry)
            abandoned.add(name)
            if entry == fill_name(name):
                try:
                    self.client.fill_end(entry, complete=False, reason='nova-compute restarted')
                except (OSError, ValueError, yolofs.YolofsError):
                    pass
            fileutils.delete_if_exists(os.path.join(self.base_dir, entry))
        return abandoned
