"""The boots nova-compute makes, timed: from a guest's start to its ready line on the console.

The boot-time model's parameters (docs/scheduling.md) come from ``yolo-calibrate``'s boots,
which QEMU makes without libvirt and Nova: not the guests this host runs (their machine type,
devices, cache mode, image and flavor). Each guest Nova spawns here is timed instead, from the
moment its QEMU runs to the first line of its console that matches ``[yolo] boot_ready_pattern``
(a login prompt by default), with its busiest vCPU's running time then and the time that vCPU
waited for a host CPU (the kernel's schedstat, through libvirt), what its disks' requests took,
its writes apart (QEMU's counts, through libvirt), whether its disk was
served from a boot image, and the host's load and boots under way when it was asked for. The last
boots are kept in ``[yolo] observed_boots_file`` and the driver reports the parameters they give
(:func:`yolo_nova.model.estimators.with_observed_boots`).

The console is read as Nova reads it for ``openstack console log show``: libvirt truncates it at
each start of QEMU, so whatever matches was printed by this boot. Guests are untrusted: one that
prints the pattern early or late is one of the last boots the medians are taken over (see
docs/scheduling.md for what a tenant can and cannot do with it).
"""

import re
import threading
import time

from oslo_log import log as logging

from yolo_nova.model import estimators

LOG = logging.getLogger(__name__)

POLL_SECONDS = 1.0
# Of a console, the tail that is searched for the ready line (Nova keeps 100 KiB of it).
CONSOLE_TAIL_BYTES = 64 << 10


class Timing:
    """A guest booting, until its ready line shows up."""

    def __init__(self, instance, started, conditions):
        self.instance = instance
        self.started = started          # time.monotonic() when its QEMU was running
        self.started_at = time.time()
        self.conditions = conditions    # the ObservedBoot fields known at its start


class BootTimer:
    """Times started guests on a thread of its own and keeps their boots in ``path``.

    ``read_console(instance)``: the guest's console output (bytes or str; raises once the guest
    is gone); ``vcpu_times(instance)``: its busiest vCPU's running time and the time it waited
    for a host CPU (None: not known), in seconds; ``disk_seconds(instance)``: the summed latency
    of its disks' reads and that of their writes and flushes so far (None: not known).
    """

    def __init__(self, path, ready_pattern, timeout, read_console, vcpu_times, accel='',
                 disk_seconds=None):
        self.path = path
        self.ready = re.compile(ready_pattern.encode(), re.MULTILINE)
        self.timeout = timeout
        self.read_console = read_console
        self.vcpu_times = vcpu_times
        self.disk_seconds = disk_seconds
        self.accel = accel
        self._timing = {}
        self._last_ended = float('-inf')    # time.monotonic() when a boot last ended
        self._thread = None
        self._lock = threading.Lock()

    def _under_way(self, younger_than):
        now = time.monotonic()
        with self._lock:
            return [timing for timing in self._timing.values()
                    if now - timing.started < younger_than]

    def in_progress(self, younger_than=float('inf')):
        """Boots being timed (started, not yet ready) that started less than ``younger_than``
        seconds ago: a guest that never prints its ready line is timed until the timeout, but
        is no longer booting long before that."""
        return len(self._under_way(younger_than))

    def booting(self, younger_than=float('inf'), ended_within=0.0):
        """Whether a boot is in progress (see in_progress) or ended (ready, gone or timed out)
        less than ``ended_within`` seconds ago."""
        return (self.in_progress(younger_than) > 0
                or time.monotonic() - self._last_ended < ended_within)

    def watch(self, instance, conditions):
        """Times the boot of ``instance``, whose QEMU runs now."""
        with self._lock:
            self._timing[instance.uuid] = Timing(instance, time.monotonic(), conditions)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name='yolo-boot-timer',
                                                daemon=True)
                self._thread.start()

    def observed(self):
        """The boots kept, of this host's accelerator ([] if the file is unreadable)."""
        try:
            boots = estimators.load_observed(self.path)
        except ValueError as e:
            LOG.warning('Ignoring the observed boots: %s', e)
            return []
        return [boot for boot in boots if boot.accel == self.accel]

    def _run(self):
        while True:
            time.sleep(POLL_SECONDS)
            with self._lock:
                timings = list(self._timing.items())
            for uuid, timing in timings:
                try:
                    done = self._check(timing)
                except Exception:
                    LOG.exception('Timing the boot of instance %s', uuid)
                    done = True
                if done:
                    with self._lock:
                        # Unless the instance started again meanwhile (a rebuild).
                        if self._timing.get(uuid) is timing:
                            del self._timing[uuid]
                        self._last_ended = time.monotonic()

    def _check(self, timing):
        """Records the boot if its guest is ready; whether it is done with (ready, gone or
        past the timeout)."""
        elapsed = time.monotonic() - timing.started
        if elapsed > self.timeout:
            LOG.info('No ready line on the console %.0f s after the start: not timed',
                     elapsed, instance=timing.instance)
            return True
        try:
            console = self.read_console(timing.instance)
        except Exception as e:
            LOG.debug('Not timing the boot further: %s', e, instance=timing.instance)
            return True
        if isinstance(console, str):
            console = console.encode(errors='replace')
        if not self.ready.search(console[-CONSOLE_TAIL_BYTES:]):
            return False
        cpu_seconds, cpu_delay = self.vcpu_times(timing.instance)
        disk = self.disk_seconds(timing.instance) if self.disk_seconds else None
        reads, writes = (None, None) if disk is None else disk
        boot = estimators.ObservedBoot(
            started_at=timing.started_at, seconds=round(elapsed, 2),
            cpu_seconds=round(cpu_seconds, 2),
            cpu_delay_seconds=None if cpu_delay is None else round(cpu_delay, 2),
            disk_seconds=None if disk is None else round(reads + writes, 2),
            disk_write_seconds=None if disk is None else round(writes, 2),
            accel=self.accel, **timing.conditions)
        LOG.info('Guest ready %.1f s after its start (vCPU %.1f s, waited for a CPU %s s, '
                 'for its disks %s s, of which writes %s s, %s)', boot.seconds,
                 boot.cpu_seconds, boot.cpu_delay_seconds, boot.disk_seconds,
                 boot.disk_write_seconds,
                 'before its download' if boot.streamed else
                 'from its boot image' if boot.boot_image else 'normal',
                 instance=timing.instance)
        try:
            boots = estimators.load_observed(self.path)
        except ValueError as e:
            LOG.warning('Starting the observed boots again: %s', e)
            boots = []
        estimators.save_observed(boots + [boot], self.path)
        return True
