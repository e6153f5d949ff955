"""A host's predicted boot time: :func:`predict` states the formula; the functions before it are
its terms, which learning (:mod:`.estimators`) solves back for the parameters."""

import dataclasses
import math

# Utilisations are clamped to [0, MAX_UTILISATION]: the model diverges at 1.
MAX_UTILISATION = 0.99


def clamp(utilisation):
    """A utilisation in [0, MAX_UTILISATION]; anything unusable (None, NaN) counts as 0."""
    if utilisation is None or not math.isfinite(utilisation):
        return 0.0
    return min(max(float(utilisation), 0.0), MAX_UTILISATION)


def _known(value):
    return value is not None and math.isfinite(value)


def io_time(alpha, io_utilisation, exponent=1.0, pole=1.0):
    """One boot's I/O part, ``e^(k x) alpha / (1 - x)^q``."""
    x = clamp(io_utilisation)
    return math.exp(exponent * x) * alpha / (1 - x) ** pole


def cpu_load(cpu_utilisation, idlest_cpu=None, pressure=None):
    """``y``, the CPU load a boot's vCPU competes with (see predict), clamped."""
    utilisation = clamp(idlest_cpu if _known(idlest_cpu) else cpu_utilisation)
    return min(utilisation, clamp(pressure)) if _known(pressure) else utilisation


def cpu_share(cpu_utilisation, runnable=None, idlest_cpu=None, contention=1.0, pressure=None):
    """``s``, the share of a CPU a boot's vCPU gets (see predict)."""
    free = 1 - contention * cpu_load(cpu_utilisation, idlest_cpu, pressure)
    if not _known(runnable):
        return free
    return min(1.0, max(free, 1 / (1 + max(0.0, runnable))))


def cpu_need(beta, cpu_utilisation, idlest_cpu=None, pressure=None, growth=0.0):
    """The CPU seconds a boot needs, ``beta (1 + g y)``."""
    return beta * (1 + growth * cpu_load(cpu_utilisation, idlest_cpu, pressure))


def cpu_time(beta, cpu_utilisation, runnable=None, idlest_cpu=None, contention=1.0,
             pressure=None, growth=0.0):
    """One boot's CPU part, ``beta (1 + g y) / s``."""
    return cpu_need(beta, cpu_utilisation, idlest_cpu, pressure, growth) / cpu_share(
        cpu_utilisation, runnable, idlest_cpu, contention, pressure)


def predict(params, io_utilisation, cpu_utilisation, boot_image=False, concurrent_boots=0,
            runnable=None, idlest_cpu=None, cpu_pressure=None):
    """Predicted boot time (seconds) of one more VM on a host with parameters ``params``
    (docs/scheduling.md, "The model"):

        t = (n + 1) e^(k x) a / (1 - x)^q  +  max(1, (n + 1) / cpus) beta (1 + g y) / s
        s = min(1, max(1 - c y, 1 / (1 + r)))       (s = 1 - c y where r is not known)

    With its refinements at their defaults (k = q = c = 1, g = 0, n = 0, r not known) this is
    the thesis' ``e^x alpha / (1 - x) + beta / (1 - y)`` (appendix A).

    * ``x``: ``io_utilisation``, the host's disk; clamped to [0, MAX_UTILISATION], where the
      model diverges at 1, as ``y`` is (None or NaN counts as 0).
    * ``y``: the CPU load the boot's vCPU competes with: ``idlest_cpu``'s utilisation where it
      is known (Linux places the vCPU on the idlest CPU), else ``cpu_utilisation``, the host's
      average; and ``cpu_pressure`` (the share of time runnable tasks waited for a CPU) where
      that is less, since the kernel averages pressure over the CPUs that are not idle.
    * ``a``, ``q``: alpha and io_pole; with ``boot_image`` (a verified boot image of the
      requested image is on the host, serving the boot's reads) alpha_yolo and io_pole_yolo.
    * ``k``, ``c``, ``g``: io_exponent, cpu_contention and beta_growth; beta and cpus as named.
    * ``n``: ``concurrent_boots``, boots already in progress on the host: they share its disk,
      and its CPUs once there are more boots than CPUs.
    * ``r``: ``runnable``, the other runnable tasks per CPU: Linux gives a CPU-bound thread at
      least its fair share of a CPU, however busy.
    """
    others = max(0, int(concurrent_boots or 0))
    alpha, pole = ((params.alpha_yolo, params.io_pole_yolo) if boot_image
                   else (params.alpha, params.io_pole))
    io = io_time(alpha, io_utilisation, params.io_exponent, pole) * (1 + others)
    cpu = cpu_time(params.beta, cpu_utilisation, runnable, idlest_cpu, params.cpu_contention,
                   cpu_pressure, params.beta_growth) \
        * max(1.0, (1 + others) / params.cpus)
    return io + cpu


@dataclasses.dataclass(frozen=True)
class RequestedImage:
    """What the scheduler knows of the image a server boots from (Nova's ImageMeta, which
    carries no raw size: Nova's image API omits Glance's ``virtual_size``): its id, its size in
    Glance (bytes, None where unknown) and its format; ``boot_image``: whether it has a
    published boot image (candidate hosts hold one)."""
    id: str
    size: int = None
    disk_format: str = None
    boot_image: bool = False


@dataclasses.dataclass(frozen=True)
class Fetch:
    """What a host must fetch before the boot, and how the boot then reads its disk."""
    seconds: float
    path: str               # 'cached', 'streamed' or 'download' (FETCH_PATHS)
    boot_image: bool        # whether the boot's reads are served from a boot image


FETCH_PATHS = ('cached', 'streamed', 'download')


def fetch(params, image, holds_base, holds_boot_image, streams_first_boots,
          boot_image_ratio):
    """What a host fetches before it boots ``image`` (a RequestedImage), by what it holds
    (docs/scheduling.md, "What hosts hold"):

    * the base file: nothing; the boot is served from the boot image if it holds one;
    * no base file, but the image has a boot image and the host boots images before their
      download (``streams_first_boots``): the boot image, unless it holds it (``ratio`` of the
      image's size: the host's boot images against their base files' data), at the host's
      rate from Glance; the boot is then served from it, and takes streamed_boot_factor times
      as long (the download runs beside the boot);
    * nothing: Nova's download of the image at that rate and, for an image that is not raw,
      its conversion to raw (at the host's rate of conversion, in bytes of the download a
      second: qemu-img's time follows the data, not the raw size); the boot is then a normal
      one.

    A size that is not known counts as 0: that host is predicted as if it held the image."""
    if holds_base:
        return Fetch(0.0, 'cached', holds_boot_image)
    size = max(0, image.size or 0)
    if image.boot_image and streams_first_boots:
        missing = 0 if holds_boot_image else boot_image_ratio * size
        return Fetch(missing / params.glance_bytes_per_second, 'streamed', True)
    seconds = size / params.glance_bytes_per_second
    if image.disk_format not in (None, 'raw'):
        seconds += size / params.convert_bytes_per_second
    return Fetch(seconds, 'download', False)
