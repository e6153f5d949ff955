"""Turning one Glance image into a published boot image.

For an active VM image: download it, convert it to raw as Nova does (``_base/<sha1(id)>``),
learn its boot image from a profiling boot through a learning yolofs mount, and publish it as a
hidden Glance image linked both ways. Every outcome is recorded on the source image in the
``yolo_boot_image_*`` properties; the source image's data and state are never touched.

Each boot image is signed with the worker's key (yolo_common/signing.py): compute hosts serve
only signed ones before an image's download. Several workers (sharing the key) may run: a build
is claimed on the source image first, and if two builds still race, every worker keeps the same
one of the signed boot images (the first created) and deletes the others, so they converge;
anything else published for the image in the worker's project (unsigned, or signed with another
key: planted) is deleted.
"""

import dataclasses
import datetime
import json
import logging
import math
import os
import re
import shutil
import socket
import subprocess
import time
import uuid

from oslo_concurrency import processutils
from oslo_utils.imageutils import format_inspector
from oslo_utils import strutils
import tenacity
try:
    # A linear-time matcher for the ready patterns images carry (tenants write them). Neither
    # in OpenStack's global requirements nor in Debian 12: the "re2" extra installs it.
    import re2
except ImportError:
    re2 = None

from yolo_common import contract
from yolo_common import images
from yolo_common import learning
from yolo_common import qemu
from yolo_common import signing
from yolo_common import yolofs
from yolo_glance import fleet
from yolo_glance import glance as glance_api
from yolo_glance import metrics as metrics_mod
from yolo_glance import profiling as profiling_mod
from yolo_glance import sandbox as sandbox_mod

LOG = logging.getLogger(__name__)

# Glance disk formats QEMU boots from, and their qemu-img names.
QEMU_FORMATS = {'raw': 'raw', 'qcow2': 'qcow2', 'vmdk': 'vmdk', 'vdi': 'vdi', 'vhd': 'vpc',
                'vhdx': 'vhdx'}
# Per-image overrides of the profiling boot (image properties).
READY_PATTERN_PROPERTY = contract.READY_PATTERN
IDLE_PROPERTY = contract.IDLE_SECONDS
MAX_PROPERTY = contract.MAX_SECONDS
# Outcomes recorded in yolo_boot_image_status.
PENDING, BUILDING, READY, SKIPPED, FAILED = (
    contract.PENDING, contract.BUILDING, contract.READY, contract.SKIPPED, contract.FAILED)


class Unbootable(Exception):
    """The image cannot give a boot image (a reason for the operator, not a transient error)."""


class TooLarge(Exception):
    """The image's disk is larger than the worker builds boot images for: skipped."""


class NoRoom(Exception):
    """The worker's scratch space cannot hold the conversion now (a transient error)."""


def guest_devices(image):
    """QEMU options for the devices Nova would give the image's guests that change what they
    read while booting."""
    if strutils.bool_from_string(image.get('hw_qemu_guest_agent')):
        return GUEST_AGENT_PORT
    return ()


def why_not(image, container_format):
    """Why ``image`` gets no boot image, or None if it should get one."""
    disk_format = image.get('disk_format')
    if image.get('size') == 0:
        return 'empty image'
    if image.get('container_format') in ('aki', 'ari') or disk_format in ('aki', 'ari'):
        return 'kernel or ramdisk image'
    if disk_format == 'iso':
        return 'ISO image'
    if disk_format not in QEMU_FORMATS:
        return 'disk format %r is not one QEMU boots from' % disk_format
    if image.get('container_format') not in ('bare', 'ovf', None):
        return 'container format %r' % image.get('container_format')
    if image.get('kernel_id') or image.get('ramdisk_id'):
        return 'boots with a separate kernel or ramdisk'
    return None


# Profiling boots run tenants' code: no network device, QEMU's seccomp sandbox (no new
# privileges, no processes spawned, no obsolete system calls, no resource control). The worker
# adds both whatever the runner plugin (profiling.py).
SANDBOX = ('-sandbox', 'on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny')
# Only the devices the worker names (QEMU's defaults add a floppy and a CD-ROM drive, among
# others); the standard VGA is kept, which QEMU's defaults and Nova's guests have, so that a
# boot reads what it reads under Nova.
NO_DEFAULT_DEVICES = ('-nodefaults', '-vga', 'std')
# Nova gives the guests of an image with hw_qemu_guest_agent=yes a virtio-serial port for the QEMU
# guest agent, and the guest's agent starts when it sees the port, reading its files during the
# boot. The profiling boot gets the same port so that those reads are in the boot image; its host
# end is a null chardev: nothing is read from it or written to it.
GUEST_AGENT_PORT = ('-chardev', 'null,id=yolo-qga', '-device', 'virtio-serial-pci',
                    '-device', 'virtserialport,chardev=yolo-qga,name=org.qemu.guest_agent.0')
# qemu-img reads tenants' data: bounded as Nova bounds it (its QEMU_IMG_LIMITS bound qemu-img
# info to 1 GiB of address space; a conversion also gets CPU time for a large image). Threads
# take their stacks' size from the stack limit: 2 MiB, not 8, keeps the up to 64 threads of a
# busy conversion's pool well inside the address space.
QEMU_IMG_LIMITS = dict(address_space=1 << 30, cpu_time=1800, stack_size=2 << 20)
GiB = 1 << 30
# Scratch space kept free beyond a conversion's raw file (the learning boot's overlay and its
# boot image, the work directory's other files).
SCRATCH_MARGIN_BYTES = 1 << 30
# Glance's default [DEFAULT] hashing_algorithm, for a source image without os_hash_algo.
DEFAULT_HASH_ALGORITHM = 'sha512'
# How long a boot image without the worker's signature may be another worker's still being
# signed (the scan deletes it after).
SIGNING_GRACE_SECONDS = 600
# A ready pattern comes from an image property: bounded, and matched by RE2 in linear time.
MAX_PATTERN_LENGTH = 512
MIN_IDLE_SECONDS = 1.0
# Why _keep_one deletes a published boot image (yolo_worker_boot_images_deleted's reasons).
DELETED_BECAUSE = {
    'duplicate': 'a duplicate',
    'rejected': 'a compute host found it other than the image',
    'not_signed': "not signed with the worker's key",
    'superseded': 'an older version',
}
MIN_MAX_SECONDS = 10.0
# Related images' boot images a build compares the new image with, at most.
RELATIVES_TRIED = 4
# Published boot images whose extents the worker keeps for merges (a few KiB to a few MiB each).
LAYOUTS_KEPT = 64
# What a merge leaves of the hosts' size limit for the boot image's header and index (32 bytes
# an extent: 32,768 extents).
INDEX_ROOM_BYTES = 1 << 20


@dataclasses.dataclass
class ProfilingOptions:
    """How profiling boots run. ``max_seconds`` and ``max_memory_mib`` are the operator's
    maxima too: an image's properties may ask for less, never more."""

    ready_pattern: str
    idle_seconds: float
    max_seconds: float
    memory_mib: int = 1024
    block_size: int = 4096
    min_boot_bytes: int = 1 << 20
    max_memory_mib: int = 4096
    # Whether the pattern is the image's (untrusted) rather than the operator's.
    images_pattern: bool = False

    def for_image(self, image):
        """The options with the image's own overrides (properties) applied, within bounds."""
        options = dataclasses.replace(self)
        if image.get(READY_PATTERN_PROPERTY):
            options.ready_pattern = image[READY_PATTERN_PROPERTY]
            options.images_pattern = True
        for prop, field, low in ((IDLE_PROPERTY, 'idle_seconds', MIN_IDLE_SECONDS),
                                 (MAX_PROPERTY, 'max_seconds', MIN_MAX_SECONDS)):
            if image.get(prop):
                try:
                    wanted = float(image[prop])
                except ValueError:
                    wanted = math.nan
                if not math.isfinite(wanted):
                    LOG.warning('%s: ignoring %s=%r', image.get('id'), prop, image[prop])
                    continue
                setattr(options, field, min(max(wanted, low), self.max_seconds))
        if image.get('min_ram'):
            options.memory_mib = max(options.memory_mib, int(image['min_ram']))
        options.memory_mib = min(options.memory_mib, self.max_memory_mib)
        return options

    def compiled_pattern(self):
        """The ready pattern for the console (bytes), or Unbootable with the reason."""
        if len(self.ready_pattern) > MAX_PATTERN_LENGTH:
            raise Unbootable('ready pattern longer than %d characters' % MAX_PATTERN_LENGTH)
        pattern = self.ready_pattern.encode()
        if re2 is None:
            # Python's matcher backtracks: an image's pattern is matched as plain text.
            if self.images_pattern:
                LOG.warning('google-re2 is not installed: the image\'s ready pattern %r is '
                            'matched as plain text', self.ready_pattern)
                pattern = re.escape(pattern)
            try:
                return re.compile(pattern)
            except re.error as e:
                raise Unbootable('bad ready pattern %r: %s' % (self.ready_pattern, e))
        try:
            return re2.compile(pattern)
        except re2.error as e:
            raise Unbootable('bad ready pattern %r: %s' % (self.ready_pattern, e))


def version_of(boot_image):
    """A published boot image's version: 1 for a profiling boot's, 0 for one derived from a
    relative's; each merge of hosts' reports makes the next of its line."""
    try:
        return max(int(boot_image.get(contract.VERSION) or 1), 0)
    except ValueError:
        return 1


def derived(boot_image):
    """Whether ``boot_image`` stands in for the image's own until its profiling boot: derived
    from a relative's, or a merge into one."""
    return bool(boot_image.get(contract.DERIVED_FROM))


def preference(boot_image):
    """The order in which boot images of one image are kept (the least first): the image's own
    line before a relative's, then the highest version, then the first created."""
    return (derived(boot_image), -version_of(boot_image), boot_image.get('created_at', ''),
            boot_image['id'])


def younger_than(image, seconds):
    """Whether Glance created ``image`` less than ``seconds`` ago (by its created_at)."""
    try:
        created = datetime.datetime.fromisoformat(image['created_at'].replace('Z', '+00:00'))
    except (KeyError, TypeError, ValueError):
        return False
    if created.tzinfo is None:
        created = created.replace(tzinfo=datetime.timezone.utc)
    return datetime.datetime.now(datetime.timezone.utc) - created < datetime.timedelta(
        seconds=seconds)


class Worker:
    """Builds, publishes and deletes boot images; one call per image, safe to call again.

    ``runner`` and ``readiness`` are the profiling plugins (profiling.py; TCG, and the console
    pattern or an idle gap, by default); ``metrics`` a metrics.Metrics (a new one by default);
    ``signer`` the worker's signing.Signer (None: boot images are published unsigned).
    """

    def __init__(self, glance, work_dir, profiling, container_format='yolo', retries=3,
                 claim_timeout=7200, yolofs_binary='yolofs', learner=None, worker_id=None,
                 clock=time.time, retry_delay=5.0, runner=None, readiness=None, metrics=None,
                 signer=None, sandboxed=True, max_virtual_size=128 * GiB, merging=None):
        self.glance = glance
        self.merging = merging or fleet.MergeOptions()
        self._layouts = {}
        self.max_virtual_size = max_virtual_size
        self.sandboxed = sandboxed
        self.signer = signer
        self.verifier = signer.verifier() if signer is not None else None
        self.work_dir = work_dir
        self.profiling = profiling
        self.runner = runner or profiling_mod.TcgRunner()
        self.readiness = (readiness if readiness is not None
                          else [profiling_mod.ConsoleReadiness(), profiling_mod.IdleReadiness()])
        self.metrics = metrics or metrics_mod.Metrics()
        self.container_format = container_format
        self.retries = retries
        self.claim_timeout = claim_timeout
        self.yolofs_binary = yolofs_binary
        self.learner = learner or learning.learn_boot_image
        # Claims on images name it, which their owners read: an id of its own, logged with the
        # host and process it stands for.
        self.worker_id = worker_id or 'worker-%s' % uuid.uuid4().hex[:12]
        LOG.info('worker id %s is %s, process %d', self.worker_id, socket.gethostname(),
                 os.getpid())
        self.clock = clock
        self.retry_delay = retry_delay

    def check(self):
        """Checks the profiling plugins and settings once, when the worker starts: raises
        profiling.PluginError saying what is wrong."""
        try:
            self.runner.check_host()
            accel, _ = profiling_mod.runner_options(self.runner, self.profiling)
            self._window(self.profiling)
            sandbox = self._sandbox(self.profiling, accel)
            if sandbox is not None:
                sandbox.check_host()
        except Unbootable as e:
            raise profiling_mod.PluginError('[yolo_profiling]: %s' % e)

    # -- decisions --------------------------------------------------------------------------

    def needs_build(self, image, usable=None):
        """Whether ``image`` (as listed) still needs work: the periodic scan's question.
        ``usable``: the ids of the boot images that count (:meth:`usable_ids`); an image that
        links another (rejected by a compute host, unsigned: published before the worker had
        its key) needs a new one."""
        if (image.get('status') != 'active'
                or contract.is_boot_image(image, self.container_format)):
            return False
        status = image.get(glance_api.STATUS)
        if status in (SKIPPED, FAILED):
            return False      # recorded; an operator clears the status to retry
        if status == BUILDING and not self._claim_expired(image):
            return False
        linked = image.get(glance_api.BOOT_IMAGE_ID)
        return not linked or (usable is not None and linked not in usable)

    def published(self):
        """The active boot images of the worker's project (one listing)."""
        return [i for i in self.glance.boot_images(self.container_format)
                if i.get('status') == 'active']

    def usable_ids(self, published):
        """The ids of the boot images of ``published`` that count as an image's own: its
        key's, not rejected, not a relative's (which an image links only until its own)."""
        return {i['id'] for i in published if not i.get(contract.REJECTED) and not derived(i)
                and self._ours(i, i.get(glance_api.SOURCE_IMAGE_ID))}

    def _too_large(self, image):
        """Why ``image`` is too large to build for, by the virtual size Glance found when it
        stored it (the worker checks its own reading of the data too), or None."""
        if (image.get('virtual_size') or 0) > self.max_virtual_size:
            return ('its virtual size, %.1f GiB, is over the %.1f GiB this cloud builds boot '
                    'images for' % (image['virtual_size'] / GiB, self.max_virtual_size / GiB))
        return None

    def _claim_expired(self, image):
        try:
            _, claimed_at = image.get(glance_api.CLAIM, '').rsplit(' ', 1)
            return self.clock() - float(claimed_at) > self.claim_timeout
        except ValueError:
            return True

    # -- building ---------------------------------------------------------------------------

    def build(self, image_id):
        """Makes sure ``image_id`` has a published boot image; returns the outcome."""
        try:
            image = self.glance.get(image_id)
        except glance_api.NotFound:
            return 'gone'
        if (image.get('status') != 'active'
                or contract.is_boot_image(image, self.container_format)):
            return 'ignored'
        if self._usable_link(image, own=True):
            return 'present'
        for refusal, reason in (('unsupported', why_not(image, self.container_format)),
                                ('too_large', self._too_large(image))):
            if reason:
                LOG.info('%s: no boot image: %s', image_id, reason)
                return self._refuse(image_id, SKIPPED, refusal, reason)
        if image.get(glance_api.STATUS) == BUILDING and not self._claim_expired(image) \
                and not image.get(glance_api.CLAIM, '').startswith(self.worker_id + ' '):
            return 'claimed'
        self._record(image_id, BUILDING, claim='%s %.0f' % (self.worker_id, self.clock()))
        attempts = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.retries + 1),
            wait=tenacity.wait_incrementing(self.retry_delay, self.retry_delay),
            retry=tenacity.retry_if_exception_type(Exception), reraise=True)
        try:
            return attempts(self._attempt_build, image)
        except Exception as e:  # the last attempt's transient error
            last_error = e
        # The image's owner reads the reason: what they can act on, not the worker's internals
        # (its log has those). The lack of scratch space is the operator's to act on.
        no_room = isinstance(last_error, NoRoom)
        return self._refuse(image_id, FAILED, 'no_room' if no_room else 'transient',
                            'gave up after %d attempts: %s' % (
                                self.retries + 1, last_error if no_room
                                else 'the worker met a transient error (its log says which)'))

    def _attempt_build(self, image):
        """One attempt at building ``image``'s boot image: its outcome, or the transient error
        (Glance, disk or yolofs trouble) that makes another attempt worth it."""
        image_id = image['id']
        try:
            return self._build_and_publish(image)
        except glance_api.NotFound:
            LOG.info('%s: deleted while its boot image was built', image_id)
            self.delete(image_id)
            return 'gone'
        except TooLarge as e:
            LOG.info('%s: no boot image: %s', image_id, e)
            return self._refuse(image_id, SKIPPED, 'too_large', str(e))
        except (Unbootable, qemu.GuestFailed, profiling_mod.PluginError) as e:
            # What QEMU itself said names the worker's paths: the log's, not the image's.
            LOG.warning('%s: no boot image: %s%s', image_id, e,
                        '; QEMU said: %s' % e.qemu_stderr
                        if getattr(e, 'qemu_stderr', '') else '')
            refusal = ('plugin' if isinstance(e, profiling_mod.PluginError)
                       else 'not_ready' if isinstance(e, qemu.BootTimeout) else 'not_bootable')
            return self._refuse(image_id, FAILED, refusal, str(e))
        except Exception:
            LOG.exception('%s: build attempt failed', image_id)
            self.metrics.build_transient_errors.inc()
            raise

    def _usable_link(self, image, own=False):
        """The boot image ``image`` links if it is usable (``own``: and not a relative's),
        else None."""
        if not image.get(glance_api.BOOT_IMAGE_ID):
            return None
        try:
            boot_image = self.glance.get(image[glance_api.BOOT_IMAGE_ID])
        except glance_api.NotFound:
            return None
        if (boot_image.get('status') == 'active' and self._ours(boot_image, image['id'])
                and not boot_image.get(contract.REJECTED)
                and not (own and derived(boot_image))):
            return boot_image
        return None

    def _ours(self, boot_image, source_image_id):
        """Whether ``boot_image`` is one this worker (or one with its key) published for
        ``source_image_id``: signed with its key, over the data Glance holds. A worker without
        a key counts any boot image of its project for the image as its own."""
        if boot_image.get(glance_api.SOURCE_IMAGE_ID) != source_image_id:
            return False
        if self.verifier is None:
            return True
        return self.verifier.verify(boot_image.get(contract.SIGNATURE), source_image_id,
                                    boot_image.get('os_hash_algo') or '',
                                    boot_image.get('os_hash_value') or '')

    def _signature(self, source_image, path):
        """{SIGNATURE: ...} of the boot image file ``path`` for ``source_image``, made before
        the upload so that the boot image is never active unsigned (a scan, this worker's or
        another's, deletes unsigned ones): over the digest Glance will compute, with the
        algorithm it used for the source image (its ``hashing_algorithm``)."""
        if self.signer is None:
            return {}
        algorithm = source_image.get('os_hash_algo') or DEFAULT_HASH_ALGORITHM
        digest = signing.file_digest(path, algorithm)
        return {contract.SIGNATURE: self.signer.sign(source_image['id'], algorithm, digest)}

    def _check_signed(self, boot_image_id, source_image_id, path):
        """Checks that Glance holds the data uploaded, by its own digest, and that the
        signature is over that digest (signed again if Glance used another algorithm)."""
        if self.signer is None:
            return
        published = self.glance.get(boot_image_id)
        algorithm = published.get('os_hash_algo')
        digest = signing.file_digest(path, algorithm)
        if published.get('os_hash_value') != digest:
            raise RuntimeError('Glance holds other data for boot image %s than was uploaded'
                               % boot_image_id)
        if not self._ours(published, source_image_id):
            self.glance.set_properties(boot_image_id, **{
                contract.SIGNATURE: self.signer.sign(source_image_id, algorithm, digest)})

    def _build_and_publish(self, image):
        image_id = image['id']
        work = os.path.join(self.work_dir, image_id)
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        try:
            base = self._download_as_raw(image, work)
            try:
                self._start_from_relative(image, base, work)
            except glance_api.NotFound:
                raise
            except Exception:
                # Only a head start: the profiling boot goes on.
                LOG.exception('%s: could not start from a related image\'s boot image',
                              image['id'])
            built = self._learn(image, base, work)
            built['properties'][contract.VERSION] = '1'
            published = self._publish(image, built)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        keeper = self._link(image_id, built)
        return READY if keeper == published else 'present'

    def _publish(self, image, built):
        """Publishes the boot image ``built`` for ``image``, signed; returns its id."""
        # The source may have gone while we booted it: do not publish for nothing.
        self.glance.get(image['id'])
        published = self.glance.publish(
            image, built['path'], self.container_format,
            dict(built['properties'], **self._signature(image, built['path'])))
        try:
            self._check_signed(published, image['id'], built['path'])
        except Exception:
            self.glance.delete(published)
            raise
        return published

    def _link(self, image_id, built, status=READY):
        """Links the boot image to keep (:meth:`_keep_one`) from ``image_id``, recording
        ``status`` (None: the image's status, reason and claim stay as they are); returns its
        id."""
        keeper = self._keep_one(image_id)
        if status is None:
            self.glance.set_properties(image_id, **{glance_api.BOOT_IMAGE_ID: keeper})
        else:
            self._record(image_id, status, boot_image_id=keeper)
        self.metrics.boot_image_bytes.observe(built['bytes'])
        self.metrics.boot_image_coverage.observe(built['coverage'])
        LOG.info('%s: boot image %s published (%s)', image_id, keeper,
                 ', '.join('%s=%s' % kv for kv in sorted(built['properties'].items())))
        return keeper

    # -- merging what hosts learned --------------------------------------------------------

    def merge(self, image_id, reports):
        """Publishes the next version of ``image_id``'s boot image, with the blocks that the
        boots of compute hosts' ``reports`` (BootReport) read outside it, as fleet.plan_merge
        chooses them, built from the image's own data; returns the outcome: 'merged',
        'unchanged' (nothing to add), 'no_boot_image' (none of the worker's linked) or 'gone'."""
        try:
            image = self.glance.get(image_id)
        except glance_api.NotFound:
            return 'gone'
        current = self._usable_link(image)
        if current is None:
            return 'no_boot_image'
        work = os.path.join(self.work_dir, image_id)
        shutil.rmtree(work, ignore_errors=True)
        os.makedirs(work)
        try:
            layout = self._layout(current, work)
            source_size = layout['identity']['source_size']
            published = [(e['source_offset'], e['length'])
                         for e in sorted(layout['extents'], key=lambda e: e['data_offset'])]
            # Hosts bound the boot image's file, whose index and header come on top.
            bound = min(self.merging.max_bytes - INDEX_ROOM_BYTES,
                        int(layout['covered_bytes'] * (1 + self.merging.max_growth)))
            plan = fleet.plan_merge(published, reports, layout['block_size'], source_size,
                                    bound, self.merging.threshold, self.merging.host_votes)
            if not plan.added:
                return 'unchanged'
            started = time.monotonic()
            base = self._download_as_raw(image, work)
            if os.path.getsize(base) != source_size:
                raise RuntimeError('the raw conversion of %s is %d bytes, its boot image says %d'
                                   % (image_id, os.path.getsize(base), source_size))
            trace = os.path.join(work, 'merged.trace')
            with open(trace, 'w') as f:
                f.writelines('%d %d\n' % extent for extent in plan.trace)
            built = self._build(image, base, work, layout['block_size'], trace=trace)
            built['properties'].update({
                # The profiling boot's figures stay those of the profiling boot.
                **{key: current[key] for key in (contract.BOOT_SECONDS,
                                                 contract.WINDOW_ENDED_BY) if key in current},
                contract.BUILD_SECONDS: '%.2f' % (time.monotonic() - started),
                contract.VERSION: str(version_of(current) + 1),
                **({contract.DERIVED_FROM: current[contract.DERIVED_FROM]}
                   if derived(current) else {}),
                contract.MERGED_HOSTS: str(plan.hosts),
                contract.MERGED_BOOTS: str(plan.boots),
                contract.MERGED_BYTES: str(plan.added_bytes),
                **({contract.MERGED_FLAVORS: ','.join(plan.flavors)[:255]}
                   if plan.flavors else {}),
            })
            if built['bytes'] > self.merging.max_bytes:
                LOG.warning('%s: a merge would make a boot image of %d bytes, over the %d '
                            'compute hosts take: not published', image_id, built['bytes'],
                            self.merging.max_bytes)
                return 'unchanged'
            self._publish(image, built)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        # A merge changes the link only: a failed profiling boot stays failed, a build under
        # way keeps its claim.
        keeper = self._link(image_id, built, status=None)
        LOG.info('%s: boot image version %s (%s) adds %d bytes in %d extents that %d boots on '
                 '%d hosts read outside version %d', image_id,
                 built['properties'][contract.VERSION], keeper, plan.added_bytes,
                 len(plan.added), plan.boots, plan.hosts, version_of(current))
        return 'merged'

    # -- starting from a relative ----------------------------------------------------------

    def relatives(self, image, raw_size):
        """Published boot images (ours, usable, of the images' own line) of images ``image``
        may derive from, the most likely first, at most RELATIVES_TRIED: the image its server
        snapshot was taken of (``base_image_ref``: its owner's, public or community), then the
        last published of images of its owner or public ones with a base file of the same
        size. What a tenant cannot see, or plant for others (a community image), is no
        relative."""
        published = [b for b in self.published()
                     if not b.get(contract.REJECTED) and not derived(b)]
        by_source = {b.get(glance_api.SOURCE_IMAGE_ID): b for b in published}
        candidates = []
        if image.get('base_image_ref') in by_source and image['base_image_ref'] != image['id']:
            candidates.append((by_source[image['base_image_ref']], ('public', 'community')))
        candidates += [(b, ('public',)) for b in sorted(
            (b for b in published if b.get(contract.SOURCE_RAW_SIZE) == str(raw_size)
             and b.get(glance_api.SOURCE_IMAGE_ID) not in (
                 image['id'], image.get('base_image_ref'))),
            key=lambda b: b.get('created_at', ''), reverse=True)]
        found = 0
        for boot_image, visible in candidates:
            source_id = boot_image.get(glance_api.SOURCE_IMAGE_ID)
            try:
                source = self.glance.get(source_id)
            except glance_api.NotFound:
                continue
            if (source.get('owner') == image.get('owner') or source.get('visibility') in visible) \
                    and self._ours(boot_image, source_id):
                yield boot_image
                found += 1
                if found == RELATIVES_TRIED:
                    return

    def _start_from_relative(self, image, base, work):
        """Publishes and links, before the image's own profiling boot, a boot image holding
        what a relative's (:meth:`relatives`) holds of the bytes this image shares with it
        (version 0 of a line the image's own replaces); returns its id, or None if no relative
        shares at least half its boot image's bytes and ``min_boot_bytes``. An earlier attempt's
        is kept."""
        # (As it is now: an earlier attempt of this build may have linked one.)
        linked = self._usable_link(self.glance.get(image['id']))
        if linked is not None:
            return linked['id']
        best = None
        for relative in self.relatives(image, os.path.getsize(base)):
            relative_work = os.path.join(work, 'relative-' + relative['id'])
            os.makedirs(relative_work)
            path = os.path.join(relative_work, 'relative.yolo')
            try:
                # (Replaced by a newer version meanwhile: another relative, or none.)
                self.glance.download(relative['id'], path)
                info = json.loads(self._yolofs('inspect', '--json', path))
                built = self._build(image, base, relative_work, info['block_size'], like=path)
            except glance_api.NotFound:
                continue
            except subprocess.CalledProcessError as e:
                LOG.info('%s: nothing shared with boot image %s: %s', image['id'],
                         relative['id'], e.stderr.strip())
                continue
            built['relative'] = relative
            built['shared'] = built['covered_bytes'] / max(info['covered_bytes'], 1)
            LOG.info('%s: shares %d bytes (%.0f%%) of boot image %s', image['id'],
                     built['covered_bytes'], 100 * built['shared'], relative['id'])
            if built['covered_bytes'] >= self.profiling.min_boot_bytes \
                    and built['shared'] >= 0.5 and built['bytes'] <= self.merging.max_bytes \
                    and (best is None or built['covered_bytes'] > best['covered_bytes']):
                best = built
        if best is None:
            return None
        source_id = best['relative'][glance_api.SOURCE_IMAGE_ID]
        best['properties'].update({contract.VERSION: '0', contract.DERIVED_FROM: source_id})
        published = self._publish(image, best)
        self._record(image['id'], BUILDING, claim='%s %.0f' % (self.worker_id, self.clock()),
                     boot_image_id=published)
        LOG.info('%s: boot image %s published from image %s\'s (%.0f%% of its bytes shared), '
                 'until its own profiling boot', image['id'], published, source_id,
                 100 * best['shared'])
        return published

    def _layout(self, boot_image, work):
        """What ``yolofs inspect`` says of published ``boot_image`` (downloaded into
        ``work``): its identity, block size, covered bytes and extents. The last few are kept
        (by id and Glance's digest): a merge that adds nothing downloads nothing."""
        key = (boot_image['id'], boot_image.get('os_hash_value'))
        if key not in self._layouts:
            path = os.path.join(work, 'published.yolo')
            self.glance.download(boot_image['id'], path)
            try:
                self._layouts[key] = json.loads(
                    self._yolofs('inspect', '--json', '--extents', path))
            finally:
                os.unlink(path)
            while len(self._layouts) > LAYOUTS_KEPT:
                self._layouts.pop(next(iter(self._layouts)))
        return self._layouts[key]

    def _download_as_raw(self, image, work):
        download = os.path.join(work, 'image')
        started = time.monotonic()
        size = self.glance.download(image['id'], download)
        LOG.info('%s: downloaded %d MiB in %.1fs', image['id'], size >> 20,
                 time.monotonic() - started)
        # What Nova checks before it converts: the data is safe and is what the image says it
        # is (a raw whole-disk image may be detected as gpt, which Nova allows).
        declared = image['disk_format']
        try:
            inspector = format_inspector.detect_file_format(download)
            inspector.safety_check()
        except format_inspector.SafetyCheckFailed as e:
            raise Unbootable('image failed the safety check: %s' % e)
        except format_inspector.ImageFormatError as e:
            raise Unbootable('image data is not a valid %s image: %s' % (declared, e))
        if str(inspector) != declared and not (declared == 'raw' and str(inspector) == 'gpt'):
            raise Unbootable('image data is %s, not the declared %s' % (inspector, declared))
        # A small upload can hold a large disk (a qcow2 image's tables may point every cluster
        # at the same data): the raw conversion is bounded by the virtual size, which is.
        # (A raw image's disk is its data; the inspector reads only the start of it.)
        virtual_size = (os.path.getsize(download) if declared == 'raw'
                        else inspector.virtual_size)
        if not virtual_size:
            raise Unbootable('image data has no disk size the worker can read')
        if virtual_size > self.max_virtual_size:
            raise TooLarge('its virtual size, %.1f GiB, is over the %.1f GiB this cloud builds '
                           'boot images for' % (virtual_size / GiB, self.max_virtual_size / GiB))
        free = shutil.disk_usage(work).free
        if free < virtual_size + SCRATCH_MARGIN_BYTES:
            raise NoRoom('the worker\'s scratch space has %.1f GiB free; converting this image '
                         'needs %.1f GiB' % (free / GiB, (virtual_size + SCRATCH_MARGIN_BYTES)
                                             / GiB))
        base_dir = os.path.join(work, '_base')
        os.makedirs(base_dir)
        base = os.path.join(base_dir, images.base_file_name(image['id']))
        try:
            # No file qemu-img writes may outgrow the disk it converts.
            images.convert_to_raw(download, base, fmt=QEMU_FORMATS[declared],
                                  limits=processutils.ProcessLimits(
                                      file_size=virtual_size, **QEMU_IMG_LIMITS))
        except processutils.ProcessExecutionError as e:
            # A truncated or damaged upload that still looks like its format.
            message = (e.stderr.strip().splitlines() or ['qemu-img failed'])[-1]
            # (the worker's paths are its own business)
            raise Unbootable('image data could not be converted to raw: %s' % re.sub(
                re.escape(work) + r"""/[^\s:'"]*""", '(image)', message))
        os.unlink(download)
        return base

    def _window(self, options):
        """(console matcher, idle seconds or None) of the boot window the readiness plugins
        ask for, within the operator's bounds."""
        matchers, idle = [], []
        for detector in self.readiness:
            matcher = detector.console_matcher(options)
            if matcher is not None:
                matchers.append(matcher)
            seconds = detector.idle_seconds(options)
            if seconds is not None:
                idle.append(min(max(float(seconds), MIN_IDLE_SECONDS), options.max_seconds))
        matcher = matchers[0] if len(matchers) == 1 else profiling_mod.AnyOf(matchers)
        return matcher, min(idle) if idle else None

    def _sandbox(self, options, accel):
        """The sandbox of a profiling boot with ``options`` (None: not sandboxed)."""
        if not self.sandboxed:
            return None
        devices = (profiling_mod.KVM_DEVICE,) if accel.split(',')[0] == 'kvm' else ()
        return sandbox_mod.Sandbox(options.memory_mib, options.max_seconds, devices=devices)

    def _learn(self, image, base, work):
        options = self.profiling.for_image(image)
        ready_marker, idle_seconds = self._window(options)
        accel, runner_args = profiling_mod.runner_options(self.runner, options)
        LOG.info('%s: profiling boot (accel %s%s; readiness %s, ready pattern %r, idle gap %ss, '
                 '%ss at most)', image['id'], accel, ''.join(' ' + a for a in runner_args),
                 ', '.join(type(d).__name__ for d in self.readiness), options.ready_pattern,
                 idle_seconds, options.max_seconds)
        # The limits, the sandbox, the devices and the absence of a network device are the
        # worker's.
        learned = self.learner(base, os.path.join(work, 'learn'),
                               boot_timeout=options.max_seconds,
                               idle_seconds=idle_seconds, ready_marker=ready_marker,
                               accel=accel, memory_mib=options.memory_mib,
                               console_log=os.path.join(work, 'console.log'),
                               network=False, sandbox=self._sandbox(options, accel),
                               yolofs_binary=self.yolofs_binary,
                               extra_args=(SANDBOX + NO_DEFAULT_DEVICES + guest_devices(image)
                                           + runner_args))
        LOG.info('%s: profiling boot ended by %s after %.1fs', image['id'], learned.ended_by,
                 learned.boot_seconds)
        self.metrics.profiling_boot_duration.labels(learned.ended_by).observe(
            learned.boot_seconds)
        started = time.monotonic()
        built = self._build(image, base, work, options.block_size, trace=learned.trace)
        if learned.ended_by != 'ready' and built['covered_bytes'] < options.min_boot_bytes:
            raise Unbootable(
                'the guest did not boot: no ready pattern, and only %d bytes read before the '
                'window ended (%s)' % (built['covered_bytes'], learned.ended_by))
        built['properties'].update({
            contract.BOOT_SECONDS: '%.1f' % learned.boot_seconds,
            contract.BUILD_SECONDS: '%.2f' % (
                learned.build_seconds + time.monotonic() - started),
            contract.WINDOW_ENDED_BY: learned.ended_by,
        })
        return built

    def _build(self, image, base, work, block_size, trace=None, like=None):
        """The boot image of base file ``base`` (``image``'s raw conversion) holding the
        ranges of ``trace`` (``OFFSET LENGTH`` lines, in the order to store them), or the
        blocks of boot image ``like`` that ``base`` holds too; built with the image's identity
        in its header and verified against ``base``."""
        output = os.path.join(work, 'boot-image.yolo')
        self._yolofs('build', *(('--trace', trace) if trace else ('--like', like)),
                     '--source', base, '--output', output,
                     '--image-id', image['id'], '--rendition', 'raw',
                     '--block-size', block_size,
                     *(['--source-digest', digest] if (digest := self._digest(image)) else []))
        self._yolofs('verify', output, base)
        info = json.loads(self._yolofs('inspect', '--json', output))
        source_size = os.path.getsize(base)
        boot_image_bytes = os.path.getsize(output)
        coverage = info['covered_bytes'] / source_size
        return {'path': output, 'bytes': boot_image_bytes, 'coverage': coverage,
                'covered_bytes': info['covered_bytes'], 'properties': {
                    contract.BOOT_IMAGE_BYTES: str(boot_image_bytes),
                    contract.COVERED_BYTES: str(info['covered_bytes']),
                    contract.COVERAGE: '%.4f' % coverage,
                    contract.SOURCE_RAW_SIZE: str(source_size),
                }}

    @staticmethod
    def _digest(image):
        if image.get('os_hash_algo') and image.get('os_hash_value'):
            return '%s:%s' % (image['os_hash_algo'], image['os_hash_value'])
        return None

    def _yolofs(self, *args):
        return subprocess.run([yolofs.binary(self.yolofs_binary), *map(str, args)], check=True,
                              capture_output=True, text=True).stdout

    def _keep_one(self, image_id):
        """The boot image of ``image_id`` to link: of those this worker's key signed and no
        compute host rejected, by :func:`preference` (every worker picks the same): the image's
        own before one derived from a relative's, the newest version (fleet merges make
        versions), the first created. The others are deleted: superseded, duplicates, rejected
        ones, and any boot image published in the worker's project that its key did not sign
        (planted)."""
        published = [i for i in self.glance.boot_images_of(image_id, self.container_format)
                     if i.get('status') == 'active']
        reasons = {i['id']: ('rejected' if i.get(contract.REJECTED) else None)
                   if self._ours(i, image_id) else 'not_signed' for i in published}
        ours = sorted((i for i in published if reasons[i['id']] is None),
                      key=preference)
        if not ours:
            raise RuntimeError('the boot image published for %s is not in Glance' % image_id)
        for extra in published:
            if extra['id'] == ours[0]['id']:
                continue
            reason = reasons[extra['id']] or (
                'duplicate' if (derived(extra), version_of(extra)) == (
                    derived(ours[0]), version_of(ours[0])) else 'superseded')
            # Another worker's, maybe, between its upload and its signature again (Glance
            # hashed it with another algorithm than the source's): left for a later scan.
            if reason == 'not_signed' and younger_than(extra, SIGNING_GRACE_SECONDS):
                continue
            (LOG.info if reason in ('duplicate', 'superseded') else LOG.warning)(
                '%s: deleting boot image %s (%s)', image_id, extra['id'], DELETED_BECAUSE[reason])
            self.glance.delete(extra['id'])
            self.metrics.boot_images_deleted.labels(reason).inc()
        return ours[0]['id']

    def _refuse(self, image_id, status, refusal, reason):
        """``image_id`` gets no boot image of its own (``status`` skipped or failed): the
        reason on the image, its kind (metrics.REFUSALS) counted. One published from a
        relative's stays linked."""
        try:
            linked = self._usable_link(self.glance.get(image_id))
        except glance_api.NotFound:
            linked = None
        self._record(image_id, status, reason, boot_image_id=linked and linked['id'])
        self.metrics.builds_refused.labels(refusal).inc()
        return status

    def _record(self, image_id, status, reason=None, claim=None, boot_image_id=None):
        properties = {glance_api.STATUS: status}
        remove = []
        for key, value in ((glance_api.REASON, reason), (glance_api.CLAIM, claim),
                           (glance_api.BOOT_IMAGE_ID, boot_image_id)):
            if value:
                properties[key] = value
            elif key != glance_api.BOOT_IMAGE_ID or status != BUILDING:
                remove.append(key)
        try:
            self.glance.set_properties(image_id, remove=remove, **properties)
        except glance_api.NotFound:
            pass

    # -- deleting ---------------------------------------------------------------------------

    def orphaned_sources(self, active_ids, published):
        """The source images, gone from Glance, that boot images of the worker's project
        (``published``) were published for (``active_ids``: the active images' ids, known to be
        there)."""
        sources = {boot_image.get(glance_api.SOURCE_IMAGE_ID) for boot_image in published}
        orphaned = []
        for source_id in sorted(sources - set(active_ids) - {None}):
            try:
                self.glance.get(source_id)
            except glance_api.NotFound:
                orphaned.append(source_id)
        return orphaned

    def delete(self, image_id):
        """Deletes the boot images published for a deleted source image; returns how many."""
        boot_images = self.glance.boot_images_of(image_id, self.container_format)
        for boot_image in boot_images:
            self.glance.delete(boot_image['id'])
            self.metrics.boot_images_deleted.labels('source_deleted').inc()
        if boot_images:
            LOG.info('%s: deleted its %d boot image(s)', image_id, len(boot_images))
        return len(boot_images)
