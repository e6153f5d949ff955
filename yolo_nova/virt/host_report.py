"""What a compute host reports to the scheduler, and the boots it times to learn it from.

The driver calls it from Nova's hooks: :meth:`HostReport.stats` at each periodic resource update
(the keys of yolo_nova.model.host_stats: yolofs' load, the host's boot-time parameters, its rates
from Glance and what it holds, as a Bloom filter) and :meth:`HostReport.spawning` around each
spawn, which times the guest from its start to its ready line (virt/boot_timer.py) with what
libvirt says of its vCPUs and disks. The parameters come, by precedence, from the calibration
file, the boots timed here and the ``[yolo]`` options of the model's table
(yolo_nova.model.estimators.host_calibration); the rates, from the host's transfers
(virt/transfers.py) and those options.
"""

import contextlib
import dataclasses
import os
import re
import time

import nova.conf
from nova.virt.libvirt import utils as libvirt_utils
from oslo_log import log as logging

from yolo_common import yolofs
from yolo_nova import conf as yolo_conf
from yolo_nova.model import calibration
from yolo_nova.model import estimators
from yolo_nova.model import host_stats
from yolo_nova.model import locality
from yolo_nova.model import parameters
from yolo_nova.virt import backing
from yolo_nova.virt import boot_timer
from yolo_nova.virt import transfers

CONF = nova.conf.CONF
yolo_conf.register_opts(CONF)
LOG = logging.getLogger(__name__)
UNCALIBRATED = calibration.UNCALIBRATED
# libvirt's VIR_DOMAIN_STATS_VCPU and _BLOCK: a domain's per-vCPU and per-disk statistics.
LIBVIRT_STATS_VCPU = 8
LIBVIRT_STATS_BLOCK = 32


def booting_window(known):
    """How long after its start a timed boot counts as under way: twice an idle boot's time."""
    return 2 * (known.alpha + known.beta)


class HostReport:
    """The report of one compute host. ``host``: the driver's libvirt host (Nova's
    ``nova.virt.libvirt.host.Host``); ``read_console(instance)``: a guest's console output;
    the others are the driver's (virt/backing.py, virt/boot_images.py, virt/first_boot.py)."""

    def __init__(self, host, read_console, backing_files, boot_images, first_boots):
        self._host = host
        self._read_console = read_console
        self.backing_files = backing_files
        self.boot_images = boot_images
        self.first_boots = first_boots
        self.boot_timer = self._make_boot_timer()
        # (time.monotonic(), model load) measured last while no guest was booting here.
        self._load_before_boots = (float('-inf'), None)
        self._spawning = 0

    def _make_boot_timer(self):
        if not CONF.yolo.boot_ready_pattern:
            return None
        try:
            return boot_timer.BootTimer(
                CONF.yolo.observed_boots_file, CONF.yolo.boot_ready_pattern,
                CONF.yolo.boot_ready_timeout, self._read_console, self._vcpu_times,
                disk_seconds=self._disk_seconds,
                accel=calibration.accel_of_virt_type(CONF.libvirt.virt_type) or '')
        except re.error as e:
            LOG.error('[yolo] boot_ready_pattern %r is not a regular expression (%s): boots '
                      'are not timed', CONF.yolo.boot_ready_pattern, e)
            return None

    def stats(self, resources):
        """The host_stats keys, or only ``yolo_active: false`` if yolofs is not serving;
        ``resources``: what Nova's get_available_resource reports."""
        status = self.backing_files.status()
        if status is None:
            return {'yolo_active': 'false'}
        cpus = max(1, int(resources.get('vcpus') or os.cpu_count() or 1))
        known = self.calibration(cpus)
        try:
            load = self._model_load(known)
        except (OSError, ValueError, yolofs.YolofsError) as e:
            LOG.warning('yolofs did not report the host load: %s', e)
            return {'yolo_active': 'false'}
        ratio = self.boot_images.size_ratio()
        state = host_stats.HostBootState(
            params=known.params, boot_images=frozenset(), updated_at=time.time(),
            held=self.held(status),
            streams_first_boots=(self.first_boots is not None
                                 and self.boot_images.verifier is not None),
            boot_image_ratio=host_stats.DEFAULT_BOOT_IMAGE_RATIO if ratio is None else ratio,
            **load)
        stats = dict(state.to_stats(), yolo_active='true')
        if self.first_boots is not None:
            # Images that boot on Nova's path here: their Glance store serves no ranges.
            stats['yolo_first_boot_images_without_ranges'] = str(
                len(self.first_boots.images_without_ranges))
            # Fills whose ranges stopped: the booting user's token expired without a service
            # token beside it.
            stats['yolo_first_boot_fills_token_expired'] = str(
                self.first_boots.fills_with_expired_tokens)
        return stats

    def held(self, status):
        """What this host holds (model.locality): the base files of images in ``_base``, the
        images yolofs serves a verified boot image of (``status``: its answer) and those of the
        warm store."""
        # Published boot images only: one learned here says nothing of what Glance publishes,
        # from which the scheduler infers what other hosts' first boots fetch.
        image_ids = status.published_image_ids()
        if self.boot_images.warm_store is not None and self.first_boots is not None:
            # Held for a first boot before the download, which only then uses it.
            image_ids |= self.boot_images.warm_store.held_image_ids()
        entries = [locality.boot_image_entry(image_id) for image_id in image_ids]
        with os.scandir(self.backing_files.base_dir) as found:
            entries += [locality.base_file_entry(entry.name) for entry in found
                        if self.backing_files.is_image_base(entry.name)
                        and '.' not in entry.name and entry.is_file()]
        return locality.BloomFilter.of(entries)

    def calibration(self, cpus=1):
        """This host's calibration (estimators.host_calibration): nova.conf's [yolo] options, else
        what the guests spawned here measured (boot_timer), else the calibration file's, else
        UNCALIBRATED's."""
        try:
            measured = calibration.load(CONF.yolo.calibration_file)
        except ValueError as e:
            LOG.warning('Ignoring the calibration file: %s', e)
            measured = None
        accel = calibration.accel_of_virt_type(CONF.libvirt.virt_type)
        if measured is not None and measured.accel and measured.accel != accel:
            # A TCG boot spends many times a KVM boot's CPU time: its parameters would be wrong.
            LOG.warning('Ignoring the calibration file %s: its boots ran under %s, this host\'s '
                        'guests under %s (virt_type %s): run yolo-calibrate again',
                        CONF.yolo.calibration_file, measured.accel, accel,
                        CONF.libvirt.virt_type)
            measured = None
        settings = {p.name: getattr(CONF.yolo, p.option)
                    for p in parameters.PARAMETERS if p.option}
        settings.update((name, getattr(CONF.yolo, name)) for name in calibration.DISK_CAPACITY)
        boots = self.boot_timer.observed() if self.boot_timer is not None else []
        known = dataclasses.replace(measured or UNCALIBRATED, cpus=cpus, **self._rates())
        return estimators.host_calibration(known, boots, CONF.yolo.learn_from_boots, settings)

    def _rates(self):
        """The rates this host measured from its transfers (an operator's options win)."""
        rates = {}
        moved = self.backing_files.transfers
        if moved is not None:
            for name, kind in (('glance_bytes_per_second', transfers.DOWNLOAD),
                               ('convert_bytes_per_second', transfers.CONVERSION)):
                rate = moved.rate(kind)
                if rate is not None:
                    low, high = parameters.BY_NAME[name].bounds
                    rates[name] = min(max(rate, low), high)
        return rates

    @contextlib.contextmanager
    def spawning(self, instance, power_on):
        """Around Nova's spawn of ``instance``: a guest it starts is timed once it runs, and
        counts as booting meanwhile (_model_load)."""
        conditions = self._boot_conditions(instance) if power_on else None
        self._spawning += 1
        try:
            yield
            if conditions is not None:
                self._time_boot(instance, conditions)
        finally:
            self._spawning -= 1

    def _time_boot(self, instance, conditions):
        # Timing a boot never fails a spawn.
        try:
            served = self._served_from(instance)
            if served is not None:
                conditions.update(boot_image=served != 'disk', streamed=served == 'streamed')
                self.boot_timer.watch(instance, conditions)
        except Exception:
            LOG.exception('Not timing the boot', instance=instance)

    def _boot_conditions(self, instance):
        """The host's load and boots under way as a boot is asked for (the ObservedBoot
        fields the scheduler predicted from), None if the boot is not to be timed."""
        if self.boot_timer is None or self.backing_files.status() is None:
            return None
        try:
            known = self.calibration()
            return dict(self._model_load(known),
                        concurrent_boots=self.boot_timer.in_progress(
                            younger_than=booting_window(known)))
        except Exception as e:
            LOG.warning('Not timing the boot: no host load from yolofs (%s)', e,
                        instance=instance)
            return None

    def _model_load(self, known):
        """The host's load as the model takes it: yolofs' now or, while guests are booting
        here, what it was before they started: the scheduler counts the boots under way apart
        (Nova's num_io_ops), and in the load they would count twice and linger up to a minute
        after they are done. A boot's load leaves yolofs' smoothed figures within three of
        their time constants of its end; the load from before is kept no longer than a boot
        counts as under way after it was measured, so that a host booting guests one after
        another does not report an ever older load (docs/scheduling.md, "What hosts
        report")."""
        host_load = self.backing_files.client.host_load()
        load = calibration.model_load(host_load, known)
        window = booting_window(known)
        settling = 3 * float(host_load.smoothing_seconds)
        now = time.monotonic()
        timer = self.boot_timer
        if not self._spawning and (
                timer is None or not timer.booting(younger_than=window, ended_within=settling)):
            self._load_before_boots = (now, load)
            return load
        measured, before = self._load_before_boots
        return before if now - measured < window + settling else load

    def _served_from(self, instance):
        """How the new guest's root disk is served: 'boot_image' (from a verified boot image),
        'streamed' (from its boot image while the image's fill runs: a first boot before the
        download), 'disk'; None if its boot says nothing of this host's boots: just after
        Nova's download (the page cache holds the image, its boot image is fetched meanwhile),
        or a root disk yolofs does not back."""
        root = os.path.join(libvirt_utils.get_instance_path(instance), 'disk')
        info = backing.backing_info(root) if os.path.exists(root) else None
        # Asked as the disk was made: a fill may have ended since.
        how = self.backing_files.take_how_made(root)
        if info is None or how == backing.AFTER_DOWNLOAD:
            return None
        if how == backing.OVER_FILL:
            return 'streamed'
        name = os.path.basename(info[0])
        if self.backing_files.directory_of(info[0]) != 'mount':
            return 'disk'
        return ('boot_image' if self.boot_images.has_boot_image(name, self.backing_files.status())
                else 'disk')

    def _vcpu_times(self, instance):
        """The busiest vCPU's running time and the time it waited for a host CPU (libvirt's
        ``vcpu.N.delay``, the kernel's schedstat; None where libvirt does not report it), in
        seconds."""
        guest = self._host.get_guest(instance)
        try:
            stats = self._domain_stats(guest, LIBVIRT_STATS_VCPU)
            vcpus = [(stats['vcpu.%d.time' % n], stats.get('vcpu.%d.delay' % n))
                     for n in range(stats['vcpu.current'])]
        except Exception as e:
            # A libvirt without domain stats (Nova's fake one among them).
            LOG.debug('No vCPU stats from libvirt (%s): its vCPUs\' times only', e,
                      instance=instance)
            vcpus = [(vcpu.time, None) for vcpu in guest.get_vcpus_info()]
        run, delay = max(vcpus, key=lambda vcpu: vcpu[0], default=(0, None))
        return run / 1e9, None if delay is None else delay / 1e9

    def _domain_stats(self, guest, kind):
        """libvirt's statistics of ``kind`` (LIBVIRT_STATS_*) of the guest's domain; raises
        where libvirt has none (Nova's fake one)."""
        [(_, stats)] = self._host.get_connection().domainListGetStats([guest._domain], kind)
        return stats

    def _disk_seconds(self, instance):
        """What the requests of the guest's disks took so far, summed over its disks, as
        (reads, writes and flushes) in seconds, as QEMU counts them (libvirt's
        ``block.N.rd.times`` and the others); None where libvirt does not report them."""
        guest = self._host.get_guest(instance)
        try:
            stats = self._domain_stats(guest, LIBVIRT_STATS_BLOCK)
            disks = range(stats['block.count'])
        except Exception as e:
            LOG.debug('No disk stats from libvirt (%s)', e, instance=instance)
            return None

        def seconds(*kinds):
            return sum(stats.get('block.%d.%s.times' % (n, kind), 0)
                       for n in disks for kind in kinds) / 1e9
        return seconds('rd'), seconds('wr', 'fl')
