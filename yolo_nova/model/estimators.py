"""The estimators: a host's parameters from boots, and the order in which they take precedence.

``yolo-calibrate`` measures idle boots (:func:`from_boots`) and one under I/O load
(:func:`io_exponent_from`). nova-compute times the guests it spawns (``ObservedBoot``, kept in
``[yolo] observed_boots_file``) and :func:`with_observed_boots` fits the parameters to them.
docs/scheduling.md, "Calibration", "Learning from the host's own boots" and "Decisions", says what
each does and why; docs/evaluation/scheduling-runs.md gives the measurements behind each choice
made here.
"""

import dataclasses
import itertools
import json
import math
import statistics
import time

from yolo_nova.model import calibration
from yolo_nova.model import parameters
from yolo_nova.model import prediction

# The boots nova-compute keeps and learns from: the last ones, so that a host's parameters follow
# its guests and its hardware as they change.
OBSERVED_BOOTS_KEPT = 20
# First boots before the download come once per image and host: the last ones are kept apart, so
# that the host's other boots do not push them out.
STREAMED_BOOTS_KEPT = 10
# Boots on a CPU less busy than this measure a boot's share of an idle CPU (cpu_contention_from).
MIN_FITTED_CPU_LOAD = 0.1
# The thesis' c = 1 counts in the fit of c as much as one boot at a CPU load of 0.5
# (cpu_contention_from): quiet boots barely move it, busy ones soon outweigh it.
CPU_CONTENTION_PRIOR_WEIGHT = 0.5 ** 2
# Boots whose CPU loads differ by less than this say nothing of how the CPU a boot needs grows
# with the load (beta_from).
MIN_LOAD_SPREAD = 0.1
# Boots at this I/O utilisation or more, beside quieter ones, measure the pole of the I/O term
# (io_term_from), tried from the thesis' 1 down to 0, the first of equal fits kept.
MIN_FITTED_IO_LOAD = 0.5
IO_POLES = tuple(i / 20 for i in range(20, -1, -1))
# beta follows the host's last boots: a boot's weight halves with every so many newer ones
# (beta_from).
BETA_HALF_LIFE_BOOTS = 4


def calibrate(idle_boot_s, idle_cpu_s, idle_yolo_boot_s, cpus):
    """Parameters from idle boots, as the thesis calibrates: beta is the CPU time a boot needs
    (measured, the guest's vCPU running time), alpha the rest of a normal boot, alpha_yolo the
    rest of a boot served from its boot image."""
    beta = max(0.0, idle_cpu_s)
    return parameters.BootTimeParameters(
        alpha=max(0.0, idle_boot_s - beta), beta=beta,
        alpha_yolo=max(0.0, idle_yolo_boot_s - beta), cpus=cpus)


def from_boots(normal, yolo, cpus, disk_iops=0.0, disk_bytes_per_second=0.0, accel=''):
    """A calibration from ``yolo-calibrate``'s idle boots (see calibrate): ``normal`` and
    ``yolo`` are lists of (boot seconds, vCPU running seconds up to ready); medians are used.

    beta is the vCPU time of the YOLO boots: under TCG the vCPU thread also runs while a normal
    boot waits for its reads, which would count part of its I/O as CPU."""
    params = calibrate(
        idle_boot_s=statistics.median(t for t, _ in normal),
        idle_cpu_s=statistics.median(c for _, c in yolo),
        idle_yolo_boot_s=statistics.median(t for t, _ in yolo), cpus=cpus)
    return calibration.Calibration(
        alpha=round(params.alpha, 3), beta=round(params.beta, 3),
        alpha_yolo=round(params.alpha_yolo, 3), cpus=cpus, disk_iops=disk_iops,
        disk_bytes_per_second=disk_bytes_per_second, accel=accel, measured_at=time.time(),
        details={'normal_boots': normal, 'yolo_boots': yolo})


def io_exponent_from(params, loaded_boot_s, io_utilisation, cpu_utilisation=0.0, runnable=None):
    """k from one normal boot under a known I/O load: the k for which the model gives the
    measured time, within the parameter's bounds."""
    x = prediction.clamp(io_utilisation)
    io_part = loaded_boot_s - prediction.cpu_time(params.beta, cpu_utilisation, runnable)
    if x <= 0 or params.alpha <= 0 or io_part <= 0:
        return 0.0
    k = math.log(io_part * (1 - x) / params.alpha) / x
    return min(max(k, 0.0), parameters.MAX_IO_EXPONENT)


@dataclasses.dataclass(frozen=True)
class ObservedBoot:
    """A guest nova-compute started and timed, from its start to its ready line, with the load
    the host reported when the boot was asked for (what the scheduler predicted from)."""
    started_at: float           # Unix time
    seconds: float              # from the guest's start to its ready line
    cpu_seconds: float          # its busiest vCPU's running time up to then
    boot_image: bool            # its disk was served from a verified boot image
    io_utilisation: float
    cpu_utilisation: float
    runnable: float = None
    concurrent_boots: int = 0   # other timed boots under way when it started
    accel: str = ''
    idlest_cpu_utilisation: float = None
    # How long its busiest vCPU waited for a host CPU while runnable (the kernel's schedstat,
    # through libvirt): None where not known.
    cpu_delay_seconds: float = None
    # The host's CPU pressure then (None: not reported).
    cpu_pressure: float = None
    # What its disks' requests took up to its ready line, summed (QEMU's latency counts,
    # through libvirt): None where not known.
    disk_seconds: float = None
    # Of those, what its writes and flushes took (None: not known).
    disk_write_seconds: float = None
    # A first boot before the download (served from the boot image while the fill runs): it
    # measures streamed_boot_factor only.
    streamed: bool = False


def load_observed(path):
    """The observed boots kept in ``path`` ([] if none; a broken file raises ValueError)."""
    try:
        with open(path) as f:
            return [ObservedBoot(**boot) for boot in json.load(f)]
    except FileNotFoundError:
        return []
    except (OSError, TypeError, json.JSONDecodeError) as e:
        raise ValueError('%s: not a list of observed boots: %s' % (path, e))


def save_observed(boots, path):
    """Keeps the last OBSERVED_BOOTS_KEPT of ``boots`` in ``path``, and of those before the
    download, the last STREAMED_BOOTS_KEPT."""
    kept = set(map(id, [b for b in boots if not b.streamed][-OBSERVED_BOOTS_KEPT:]
                   + [b for b in boots if b.streamed][-STREAMED_BOOTS_KEPT:]))
    calibration.write_json([dataclasses.asdict(boot) for boot in boots if id(boot) in kept],
                           path, indent=1)


def cpu_load_of(boot):
    """The CPU load the model took for an observed boot (prediction.cpu_load)."""
    return prediction.cpu_load(boot.cpu_utilisation, boot.idlest_cpu_utilisation,
                               boot.cpu_pressure)


def io_load_factor(boot, io_exponent, pole=1.0):
    """How much the model's I/O term grows an idle boot's I/O part at the boot's load: the
    disk's, and the boots under way beside it sharing it."""
    others = max(0, boot.concurrent_boots)
    return prediction.io_time(1.0, boot.io_utilisation, io_exponent, pole) * (1 + others)


def halted_seconds(boot):
    """What a boot spent neither running, nor waiting for a CPU, nor for its disks: its guest
    halted, waiting for its timers. 0 where its waits are not all known."""
    if boot.cpu_delay_seconds is None or boot.disk_seconds is None:
        return 0.0
    return max(0.0, boot.seconds - boot.cpu_seconds - boot.cpu_delay_seconds
               - boot.disk_seconds)


def needed_seconds(boot):
    """The time a boot's guest needs whatever it waits for: its vCPU's running time and its
    halts (beta_from fits beta to it)."""
    return boot.cpu_seconds + halted_seconds(boot)


def io_seconds(boot, beta, cpus, beta_growth=0.0):
    """What an observed boot took for its I/O: beyond the CPU it needs (``beta``, grown with its
    CPU load by ``beta_growth``) and its wait for a CPU; at least 0.

    The wait for a CPU is the vCPU's own (schedstat's run delay) where it is known; where it is
    not, ``beta`` shared with the boots under way beyond the CPUs, and any other wait for a busy
    CPU counts as I/O. Where the disk requests were timed, the I/O part is at most what they
    took (the rest is the guest's halts, which beta holds); a boot served from its boot image
    whose waits are all known has exactly that: its few requests overlap its vCPU's running,
    and what is left beyond its CPU time is that time's noise. docs/scheduling.md, "Learning
    from the host's own boots", alpha_yolo and alpha."""
    if boot.boot_image and boot.cpu_delay_seconds is not None \
            and boot.disk_seconds is not None:
        return boot.disk_seconds
    need = prediction.cpu_need(beta, boot.cpu_utilisation, boot.idlest_cpu_utilisation,
                               boot.cpu_pressure, beta_growth)
    if boot.cpu_delay_seconds is not None:
        cpu = need + boot.cpu_delay_seconds
    else:
        cpu = need * max(1.0, (1 + max(0, boot.concurrent_boots)) / cpus)
    waited = boot.seconds - cpu
    if boot.disk_seconds is not None:
        waited = min(waited, boot.disk_seconds)
    return max(0.0, waited)


def weighted_median(pairs):
    """The median of the values of (value, weight) pairs, each counted by its weight: the lower
    value at which half the total weight is reached."""
    pairs = sorted(pairs)
    half = sum(weight for _, weight in pairs) / 2
    reached = 0.0
    for value, weight in pairs:
        reached += weight
        if reached >= half:
            return value
    raise ValueError('no values')


def io_term_from(boots, known, pole):
    """(alpha, pole) for ``boots`` of one kind (alpha_yolo and io_pole_yolo for boots served
    from a boot image, alpha and io_pole for the others), given the calibration ``known`` (its
    beta, growth, CPUs and k): the least-absolute-deviation fit of each boot's I/O part
    (io_seconds) to ``alpha * L``, ``L`` the I/O term's growth at its load (io_load_factor).

    For a pole, alpha is the median of the boots' I/O parts brought back to an idle disk,
    ``io_seconds / L``, weighted by ``L``: the boots under load, where a prediction matters,
    decide, and one odd boot moves it no further than its weight. The pole is fitted where the
    boots ran both quiet and under I/O load (below and at least MIN_FITTED_IO_LOAD): the one of
    IO_POLES that deviates least, the larger on a tie; boots at one load cannot tell alpha from
    the pole, which then stays ``pole``. docs/scheduling.md, "Learning from the host's own
    boots", alpha_yolo and alpha, io_pole and io_pole_yolo."""
    seconds = [io_seconds(b, known.beta, known.cpus, known.beta_growth) for b in boots]
    loaded = [b.io_utilisation >= MIN_FITTED_IO_LOAD for b in boots]
    poles = IO_POLES if any(loaded) and not all(loaded) else (pole,)
    best = None
    for pole in poles:
        factors = [io_load_factor(b, known.io_exponent, pole) for b in boots]
        alpha = weighted_median((s / f, f) for s, f in zip(seconds, factors))
        deviation = sum(abs(alpha * f - s) for s, f in zip(seconds, factors))
        if best is None or deviation < best[0] - 1e-9:
            best = (deviation, alpha, pole)
    return best[1], best[2]


def recency_weights(boots, half_life):
    """Each boot's weight, halving with every ``half_life`` boots started after it (the list's
    order among boots started at once): 1 for the newest."""
    if not half_life > 0:
        raise ValueError('a half-life is a number of boots above 0, not %r' % (half_life,))
    newest_first = sorted(range(len(boots)), key=lambda i: (boots[i].started_at, i),
                          reverse=True)
    weights = [0.0] * len(boots)
    for age, i in enumerate(newest_first):
        weights[i] = 0.5 ** (age / half_life)
    return weights


def beta_from(boots, min_boots, half_life=BETA_HALF_LIFE_BOOTS):
    """(beta, beta_growth) from the time boots served from a boot image needed (needed_seconds)
    against their CPU load ``y``: Theil-Sen's line ``needed = beta + slope y`` (the median of
    the slopes between boots at loads at least MIN_LOAD_SPREAD apart, then the median
    intercept), robust to odd boots as a median is; ``beta_growth = slope / beta``, within the
    parameter's bounds. Without ``min_boots`` such slopes, or with a slope below 0: (their
    median needed time, 0).

    Both medians weigh each boot by its recency (recency_weights, halving every ``half_life``
    boots; None: all alike): the CPU a boot needs follows the host's speed, which drifts, and a
    tenant's guests must make about that many of the host's last boots to move it. The slope
    needs boots at loads apart, which may be old: all count alike there. docs/scheduling.md,
    "Learning from the host's own boots", beta and beta_growth."""
    points = [(cpu_load_of(b), needed_seconds(b)) for b in boots]
    if half_life is None:
        def median(values):
            return statistics.median(values)
    else:
        weights = recency_weights(boots, half_life)

        def median(values):
            return weighted_median(zip(values, weights))
    slopes = [(n2 - n1) / (y2 - y1) for (y1, n1), (y2, n2) in itertools.combinations(points, 2)
              if abs(y2 - y1) >= MIN_LOAD_SPREAD]
    level = median([needed for _, needed in points])
    if len(slopes) < max(1, min_boots):
        return level, 0.0
    slope = statistics.median(slopes)
    beta = median([needed - slope * y for y, needed in points])
    if slope <= 0 or beta <= 0:
        return level, 0.0
    return beta, min(slope / beta, parameters.MAX_BETA_GROWTH)


def cpu_contention_from(boots, cpus, min_boots):
    """c of the model's CPU share ``1 - c y``, within [0, 1], from the boots served from a boot
    image (a normal boot's vCPU waits for its reads) with no more boots under way than CPUs;
    None without ``min_boots`` of them that measure it.

    Where the vCPU's wait for a CPU is known (schedstat's run delay), a boot's share of a CPU is
    ``run / (run + delay)``, which neither halts nor I/O change, and c is the least-squares fit
    of ``1 - share = c y`` over the boots with some load: the busy boots, which the prediction
    is for, weigh most. The thesis' c = 1 enters as a prior worth one boot at a load of 0.5
    (CPU_CONTENTION_PRIOR_WEIGHT): quiet boots say next to nothing of c. Where the delay is not
    known, a boot's share is its vCPU time over its wall time, relative to what boots got on an
    idle CPU, and c the median of ``(1 - share) / y`` over the boots on a CPU at least
    MIN_FITTED_CPU_LOAD busy. docs/scheduling.md, "Learning from the host's own boots",
    cpu_contention."""
    idle, loaded, timed = [], [], []
    for boot in boots:
        if not boot.boot_image or boot.seconds <= 0 or boot.concurrent_boots + 1 > cpus:
            continue
        y = cpu_load_of(boot)
        delay = boot.cpu_delay_seconds
        if delay is not None and boot.cpu_seconds + delay > 0:
            if y > 0:
                timed.append((y, boot.cpu_seconds / (boot.cpu_seconds + delay)))
            continue
        share = min(1.0, boot.cpu_seconds / boot.seconds)
        (loaded if y >= MIN_FITTED_CPU_LOAD else idle).append((y, share))
    idle_share = statistics.median(share for _, share in idle) if idle else 1.0
    if len(timed) >= max(1, min_boots):
        c = ((sum(y * (1 - share) for y, share in timed) + CPU_CONTENTION_PRIOR_WEIGHT)
             / (sum(y * y for y, _ in timed) + CPU_CONTENTION_PRIOR_WEIGHT))
    elif len(loaded) >= max(1, min_boots) and idle_share > 0:
        c = statistics.median((1 - min(1.0, share / idle_share)) / y for y, share in loaded)
    else:
        return None
    return round(min(max(c, 0.0), 1.0), 3)


def with_observed_boots(known, boots, min_boots, beta_half_life=BETA_HALF_LIFE_BOOTS):
    """``known`` with the parameters the host's own ``boots`` (of its accelerator) give, each
    where at least ``min_boots`` boots measure it: beta and beta_growth from the boots served
    from a boot image (beta_from); alpha_yolo and alpha, with the pole of each, from those and
    the normal boots (io_term_from); cpu_contention (cpu_contention_from); and from the first
    boots before the download, streamed_boot_factor (streamed_boot_factor_from)."""
    if min_boots <= 0:
        return known
    streamed = [b for b in boots if b.streamed]
    boots = [b for b in boots if not b.streamed]
    served = [b for b in boots if b.boot_image]
    normal = [b for b in boots if not b.boot_image]
    fields = {}
    if len(served) >= min_boots:
        beta, growth = beta_from(served, min_boots, beta_half_life)
        fields['beta'] = round(beta, 3)
        if growth > 0:
            fields['beta_growth'] = round(growth, 3)
    learned = dataclasses.replace(known, **fields)
    for name, kind in (('alpha_yolo', served), ('alpha', normal)):
        pole_name = parameters.BY_NAME[name].pole
        if len(kind) >= min_boots:
            alpha, pole = io_term_from(kind, learned, getattr(known, pole_name))
            fields[name] = round(alpha, 3)
            if pole != getattr(known, pole_name):
                fields[pole_name] = pole
    contention = cpu_contention_from(boots, known.cpus, min_boots)
    if contention is not None:
        fields['cpu_contention'] = contention
    if len(streamed) >= min_boots:
        fields['streamed_boot_factor'] = streamed_boot_factor_from(
            streamed, dataclasses.replace(learned, **fields))
    if not fields:
        return known
    details = dict(known.details, observed_boots={'boot_image': len(served),
                                                  'normal': len(normal),
                                                  'streamed': len(streamed),
                                                  'learned': sorted(fields)})
    return dataclasses.replace(known, details=details, **fields)


def streamed_boot_factor_from(streamed, known):
    """The median of the ``streamed`` boots' times against what ``known`` predicts of the same
    boots with their base files held (served from their boot images), within the parameter's
    bounds."""
    ratios = []
    for boot in streamed:
        held = prediction.predict(known, boot.io_utilisation, boot.cpu_utilisation,
                                  boot_image=True, concurrent_boots=boot.concurrent_boots,
                                  runnable=boot.runnable, idlest_cpu=boot.idlest_cpu_utilisation,
                                  cpu_pressure=boot.cpu_pressure)
        if held > 0:
            ratios.append(boot.seconds / held)
    low, high = parameters.BY_NAME['streamed_boot_factor'].bounds
    return round(min(max(statistics.median(ratios), low), high), 3) if ratios else \
        known.streamed_boot_factor


def host_calibration(known, boots, min_boots, settings):
    """The calibration a host reports, by precedence, the last winning: ``known`` (its
    calibration file, else UNCALIBRATED), what its own ``boots`` give (with_observed_boots, at
    ``min_boots``), and the operator's ``settings`` (calibration fields to values, None for
    unset: the [yolo] options of the table's parameters and DISK_CAPACITY).

    A setting of a parameter the boots do not learn applies before learning, which uses it (k
    brings the boots back to an idle disk); a setting of an I/O part brings the thesis' pole
    (parameters.with_thesis_poles)."""
    settings = {name: value for name, value in settings.items() if value is not None}
    fixed = {name: value for name, value in settings.items()
             if name in parameters.BY_NAME and not parameters.BY_NAME[name].learned}
    known = with_observed_boots(dataclasses.replace(known, **fixed), boots, min_boots)
    later = {name: value for name, value in settings.items() if name not in fixed}
    return dataclasses.replace(known, **parameters.with_thesis_poles(later))
