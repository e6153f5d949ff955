"""The boot-time model (thesis, appendix A), with a verified boot image and concurrent boots.

    t = e^x * alpha / (1 - x) + beta / (1 - y)

``x`` is the host's I/O utilisation and ``y`` its CPU utilisation (0..1); ``alpha`` and ``beta`` are
the I/O and CPU parts of a boot on the idle host. Both utilisations are clamped below 1, where the
model diverges.

A verified boot image on the host serves the boot's reads from memory, so the I/O part of the boot
is the part the boot image does not cover: it has its own idle value, ``alpha_yolo``, calibrated by
booting through yolofs with the boot image loaded. On the emulated HDD of docs/boot-benchmark.md,
an idle normal boot takes 5.9 s longer than a warm-cache boot and a YOLO boot 0.4 s; under 16 I/O
stressors the normal boot's extra time grows to 40.7 s while the YOLO boot's stays at -0.3 s.

Refinements, all measured (docs/scheduling.md, "Model accuracy"), each off unless the host
reports what it needs:

* ``io_exponent`` (k): the I/O part grows as ``e^(k x) / (1 - x)``. The thesis' k = 1 comes
  from its HDD's seeks; a disk that shares its rate without seeking (an SSD, a throttled volume)
  has k near 0. ``yolo-calibrate`` measures k from one boot under a known I/O load.
* ``io_pole`` and ``io_pole_yolo`` (q, 0..1, for normal boots and for boots served from a boot
  image): the I/O part grows as ``e^(k x) / (1 - x)^q``. The thesis' q = 1 is a queue that
  grows without bound as the disk fills; a boot served from its boot image reads from memory
  and writes its overlay, and on the all-in-one's emulated HDD its requests took 3-8 times as
  long at x 0.99, where ``1 / (1 - x)`` is 100. Fitted per host from its boots under I/O load
  (:func:`yolo_nova.calibration.with_observed_boots`); 1 until then.
* ``runnable`` (tasks per CPU waiting or running, besides the boot): Linux gives a CPU-bound
  thread at least a fair share ``1 / (1 + runnable)`` of a CPU however busy the CPU is, so the
  CPU part is ``beta / max(1 - y, 1 / (1 + runnable))``. Without it, ``beta / (1 - y)``.
* ``idlest_cpu`` (the least busy CPU's utilisation): Linux places the boot's vCPU thread on the
  idlest CPU, so ``y`` above is that CPU's: on a host whose load sits on some of its CPUs (a
  running guest's vCPU), a boot gets a whole CPU however busy the host is on average.
* ``cpu_pressure`` (p, 0..1: the share of time some runnable task waited for a CPU, the
  kernel's ``/proc/pressure/cpu``): the load a boot's vCPU yields to is the load that makes
  tasks wait, and a CPU's utilisation does not say which of its load is that. On the
  all-in-one, CPUs 70-90 % busy with fio on a loop device over memory (runnable) cost a boot
  19 s of waiting, and as busy with fio on a disk (tasks that sleep) almost none. Where the host
  reports its pressure, ``y`` above is ``p`` where it is less (the kernel averages pressure
  over the CPUs that are not idle: an idle CPU is the boot's whatever the others wait for).
* ``beta_growth`` (g): the CPU a boot needs grows with the load it shares its CPU with,
  ``beta (1 + g y)``: its code shares the core's caches and the kernel's time with that load.
  On the all-in-one a TCG guest's vCPU ran 28.6-31.6 s on a quiet CPU and 34.0-37.0 s at a CPU
  pressure of 0.52-0.62 (g near 0.3). Fitted per host from the vCPU time of the guests it timed
  (:func:`yolo_nova.calibration.with_observed_boots`); 0 until then.
* ``cpu_contention`` (c, 0..1): the share of that CPU's load a boot's vCPU actually yields to,
  ``1 - c y`` instead of ``1 - y``. Tasks that mostly sleep (I/O-bound stressors, a guest idling
  after its boot, a guest just deleted whose load is still in the smoothed figure) leave a
  CPU-bound thread more than ``1 - y``: c is fitted per host from the vCPU time of the guests it
  timed (:func:`yolo_nova.calibration.with_observed_boots`); the thesis' 1 until then.

Boots already in progress on the host (Nova's ``num_io_ops``) compete for the same disk and CPUs:
the Xen study shows the longest of n concurrent boots growing linearly with n. The model spreads
the I/O part over the n + 1 boots sharing the disk, and the CPU part over the host's CPUs once
there are more boots than CPUs.

This module imports nothing from Nova: the scheduler filter, the weigher and the calibration
command all use it.
"""

import dataclasses
import math

# Utilisations are clamped to [0, MAX_UTILISATION]: the model diverges at 1.
MAX_UTILISATION = 0.99


# Bounds of what a host may report (its stats come over the message bus and through the
# database): beyond them the model's arithmetic overflows, and the scheduler must not raise.
MAX_IO_EXPONENT = 3.0
MAX_BETA_GROWTH = 1.0       # a boot needing twice its CPU on a saturated CPU
MAX_SECONDS = 86400.0
MAX_CPUS = 1 << 16


@dataclasses.dataclass(frozen=True)
class BootTimeParameters:
    """The calibrated parameters of one host (seconds) and its CPU count."""
    alpha: float
    beta: float
    alpha_yolo: float
    cpus: int = 1
    io_exponent: float = 1.0
    cpu_contention: float = 1.0
    beta_growth: float = 0.0
    io_pole: float = 1.0
    io_pole_yolo: float = 1.0

    def __post_init__(self):
        for name, most in (('alpha', MAX_SECONDS), ('beta', MAX_SECONDS),
                           ('alpha_yolo', MAX_SECONDS), ('io_exponent', MAX_IO_EXPONENT),
                           ('cpu_contention', 1.0), ('beta_growth', MAX_BETA_GROWTH),
                           ('io_pole', 1.0), ('io_pole_yolo', 1.0)):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 <= value <= most):
                raise ValueError('%s must be a number from 0 to %g, not %r' % (name, most, value))
        if not (isinstance(self.cpus, int) and 1 <= self.cpus <= MAX_CPUS):
            raise ValueError('cpus must be an integer from 1 to %d, not %r' % (MAX_CPUS, self.cpus))


# Each I/O part's pole. An I/O part an operator sets grows as the thesis' does, not as a fit to
# the host's boots did (with_thesis_poles).
POLES = {'alpha': 'io_pole', 'alpha_yolo': 'io_pole_yolo'}


def with_thesis_poles(overrides):
    """``overrides`` of parameters, with the thesis' pole for each I/O part they set."""
    return dict(overrides, **{POLES[name]: 1.0 for name in overrides if name in POLES})


def clamp(utilisation):
    """A utilisation in [0, MAX_UTILISATION]; anything unusable (None, NaN) counts as 0."""
    if utilisation is None or not math.isfinite(utilisation):
        return 0.0
    return min(max(float(utilisation), 0.0), MAX_UTILISATION)


def io_time(alpha, io_utilisation, exponent=1.0, pole=1.0):
    x = clamp(io_utilisation)
    return math.exp(exponent * x) * alpha / (1 - x) ** pole


def _known(value):
    return value is not None and math.isfinite(value)


def cpu_load(cpu_utilisation, idlest_cpu=None, pressure=None):
    """The CPU load a boot's vCPU competes with: the utilisation of the CPU Linux places the
    vCPU on (the idlest one's when it is known, else the host's average), or the host's CPU
    pressure if that is less: the part of the load that keeps runnable tasks waiting. The kernel
    averages pressure over the CPUs that are not idle, so an idle CPU's whole share, which the
    boot gets, comes from its utilisation. Clamped."""
    utilisation = clamp(idlest_cpu if _known(idlest_cpu) else cpu_utilisation)
    return min(utilisation, clamp(pressure)) if _known(pressure) else utilisation


def cpu_share(cpu_utilisation, runnable=None, idlest_cpu=None, contention=1.0, pressure=None):
    """The share of a CPU a boot's vCPU thread gets: what the load it competes with (cpu_load)
    leaves free, of which it yields ``contention``, and at least its fair share among the
    runnable tasks when their number is known."""
    free = 1 - contention * cpu_load(cpu_utilisation, idlest_cpu, pressure)
    if not _known(runnable):
        return free
    return min(1.0, max(free, 1 / (1 + max(0.0, runnable))))


def cpu_need(beta, cpu_utilisation, idlest_cpu=None, pressure=None, growth=0.0):
    """The CPU seconds a boot needs: ``beta``, grown by ``growth`` times the load it shares its
    CPU with (cpu_load)."""
    return beta * (1 + growth * cpu_load(cpu_utilisation, idlest_cpu, pressure))


def cpu_time(beta, cpu_utilisation, runnable=None, idlest_cpu=None, contention=1.0,
             pressure=None, growth=0.0):
    return cpu_need(beta, cpu_utilisation, idlest_cpu, pressure, growth) / cpu_share(
        cpu_utilisation, runnable, idlest_cpu, contention, pressure)


def predict(params, io_utilisation, cpu_utilisation, boot_image=False, concurrent_boots=0,
            runnable=None, idlest_cpu=None, cpu_pressure=None):
    """Predicted boot time (seconds) of one more VM on a host.

    ``boot_image``: a verified boot image of the requested image is on the host.
    ``concurrent_boots``: boots already in progress there.
    ``runnable``: other runnable tasks per CPU (None: unknown).
    ``idlest_cpu``: utilisation of the host's least busy CPU (None: unknown).
    ``cpu_pressure``: share of time runnable tasks waited for a CPU (None: unknown).
    """
    others = max(0, int(concurrent_boots or 0))
    alpha, pole = ((params.alpha_yolo, params.io_pole_yolo) if boot_image
                   else (params.alpha, params.io_pole))
    io = io_time(alpha, io_utilisation, params.io_exponent, pole) * (1 + others)
    cpu = cpu_time(params.beta, cpu_utilisation, runnable, idlest_cpu, params.cpu_contention,
                   cpu_pressure, params.beta_growth) \
        * max(1.0, (1 + others) / params.cpus)
    return io + cpu


def io_exponent_from(params, loaded_boot_s, io_utilisation, cpu_utilisation=0.0, runnable=None):
    """k from one normal boot under a known I/O load: the k for which the model gives the
    measured time, within [0, MAX_IO_EXPONENT]."""
    x = clamp(io_utilisation)
    io_part = loaded_boot_s - cpu_time(params.beta, cpu_utilisation, runnable)
    if x <= 0 or params.alpha <= 0 or io_part <= 0:
        return 0.0
    k = math.log(io_part * (1 - x) / params.alpha) / x
    return min(max(k, 0.0), MAX_IO_EXPONENT)


def calibrate(idle_boot_s, idle_cpu_s, idle_yolo_boot_s, cpus):
    """Parameters from idle boots, as the thesis calibrates: beta is the CPU time a boot needs
    (measured, the guest's vCPU running time), alpha the rest of a normal boot, alpha_yolo the
    rest of a boot served from its boot image."""
    beta = max(0.0, idle_cpu_s)
    return BootTimeParameters(alpha=max(0.0, idle_boot_s - beta), beta=beta,
                              alpha_yolo=max(0.0, idle_yolo_boot_s - beta), cpus=cpus)
