"""A host's calibration: its boot-time parameters and its disk's capacity, in one JSON file.

``yolo-calibrate`` writes it on a compute node (``[yolo] calibration_file``); the compute driver
reports what it holds to the scheduler. Options set in nova.conf (``[yolo] boot_time_*``,
``disk_iops``, ``disk_bytes_per_second``) win over the file, and aggregate metadata wins over
both at the scheduler (see :mod:`yolo_nova.scheduler.utils`).

The disk's capacity turns yolofs' smoothed operation and byte rates into the thesis' I/O
*throughput* utilisation: ``x = max(iops / disk_iops, bytes_per_second / disk_bytes_per_second)``.
Without it, the fraction of time the disk was busy stands in for ``x``. No Nova imports.
"""

import dataclasses
import itertools
import json
import os
import statistics
import time

from yolo_nova import boot_model


@dataclasses.dataclass(frozen=True)
class Calibration:
    alpha: float
    beta: float
    alpha_yolo: float
    cpus: int
    disk_iops: float = 0.0              # 0: unknown
    disk_bytes_per_second: float = 0.0  # 0: unknown
    io_exponent: float = 1.0            # k of e^(k x); the thesis' 1 until measured
    cpu_contention: float = 1.0         # c of 1 - c y; the thesis' 1 until fitted from boots
    beta_growth: float = 0.0            # g of beta (1 + g y); 0 until fitted from boots
    io_pole: float = 1.0                # q of (1 - x)^q, normal boots; 1 until fitted from boots
    io_pole_yolo: float = 1.0           # the same, boots served from a boot image
    accel: str = ''                     # QEMU's accelerator in the boots: 'kvm', 'tcg', '' unknown
    measured_at: float = 0.0
    details: dict = dataclasses.field(default_factory=dict)

    @property
    def params(self):
        return boot_model.BootTimeParameters(alpha=self.alpha, beta=self.beta,
                                             alpha_yolo=self.alpha_yolo, cpus=self.cpus,
                                             io_exponent=self.io_exponent,
                                             cpu_contention=self.cpu_contention,
                                             beta_growth=self.beta_growth, io_pole=self.io_pole,
                                             io_pole_yolo=self.io_pole_yolo)


# Parameters of an uncalibrated host: the emulated HDD of docs/boot-benchmark.md under TCG.
UNCALIBRATED = Calibration(alpha=5.9, beta=22.7, alpha_yolo=0.4, cpus=1)


def load(path):
    """The calibration in ``path``, or None if there is none; a broken file raises ValueError."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError('%s: %s' % (path, e))
    try:
        calibration = Calibration(**data)
        calibration.params  # validates the numbers
        if calibration.accel not in ('', 'kvm', 'tcg'):
            raise ValueError('unknown accelerator %r' % calibration.accel)
    except (TypeError, ValueError) as e:
        raise ValueError('%s: not a calibration: %s' % (path, e))
    return calibration


def save(calibration, path):
    write_json(dataclasses.asdict(calibration), path, indent=2, sort_keys=True)


def write_json(data, path, **dump_options):
    """``data`` as the whole of ``path`` at once (a reader never sees half a file)."""
    tmp = '%s.%d.tmp' % (path, os.getpid())
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(tmp, 'w') as f:
        json.dump(data, f, **dump_options)
        f.write('\n')
    os.replace(tmp, path)


def io_utilisation(host_load, disk_iops=0.0, disk_bytes_per_second=0.0):
    """x for the model from yolofs' ``host_load`` answer: throughput utilisation when the disk's
    capacity is known, else the fraction of time it was busy."""
    shares = []
    if disk_iops > 0 and 'iops' in host_load:
        shares.append(float(host_load['iops']) / disk_iops)
    if disk_bytes_per_second > 0 and 'bytes_per_second' in host_load:
        shares.append(float(host_load['bytes_per_second']) / disk_bytes_per_second)
    if shares:
        return min(max(shares), 1.0)
    return float(host_load['io_utilisation'])


def model_load(host_load, known):
    """The model's load figures (the fields HostBootState and ObservedBoot share) from yolofs'
    ``host_load`` answer and the host's calibration ``known``."""
    return dict(io_utilisation=io_utilisation(host_load, known.disk_iops,
                                              known.disk_bytes_per_second),
                cpu_utilisation=float(host_load['cpu_utilisation']),
                runnable=host_load.get('runnable_per_cpu'),
                idlest_cpu_utilisation=host_load.get('idlest_cpu_utilisation'),
                cpu_pressure=host_load.get('cpu_pressure'))


def accel_of_virt_type(virt_type):
    """The QEMU accelerator of guests Nova starts with ``[libvirt] virt_type`` (None: no QEMU)."""
    return {'kvm': 'kvm', 'qemu': 'tcg'}.get(virt_type)


def from_boots(normal, yolo, cpus, disk_iops=0.0, disk_bytes_per_second=0.0, accel=''):
    """The parameters from idle boots: beta is the CPU time a boot needs, alpha the rest of a
    normal boot, alpha_yolo the rest of a boot served from its boot image. ``normal`` and
    ``yolo`` are lists of (boot seconds, vCPU running seconds up to ready); medians are used.

    beta is the vCPU running time of the YOLO boots, which hardly wait for the disk: under TCG
    the vCPU thread also runs while a normal boot waits for its reads (28-30 s of vCPU time for
    a 28-30 s normal boot on the emulated HDD, 22-24 s for a boot served from memory), so a
    normal boot's vCPU time would count part of its I/O as CPU.
    """
    params = boot_model.calibrate(
        idle_boot_s=statistics.median(t for t, _ in normal),
        idle_cpu_s=statistics.median(c for _, c in yolo),
        idle_yolo_boot_s=statistics.median(t for t, _ in yolo), cpus=cpus)
    return Calibration(alpha=round(params.alpha, 3), beta=round(params.beta, 3),
                       alpha_yolo=round(params.alpha_yolo, 3), cpus=cpus,
                       disk_iops=disk_iops, disk_bytes_per_second=disk_bytes_per_second,
                       accel=accel, measured_at=time.time(),
                       details={'normal_boots': normal, 'yolo_boots': yolo})


# The boots nova-compute keeps and learns from: the last ones, so that a host's parameters follow
# its guests and its hardware as they change.
OBSERVED_BOOTS_KEPT = 20
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
    """Keeps the last OBSERVED_BOOTS_KEPT of ``boots`` in ``path``."""
    write_json([dataclasses.asdict(boot) for boot in boots[-OBSERVED_BOOTS_KEPT:]], path,
               indent=1)


def cpu_load_of(boot):
    """The CPU load the model took for an observed boot (boot_model.cpu_load)."""
    return boot_model.cpu_load(boot.cpu_utilisation, boot.idlest_cpu_utilisation,
                               boot.cpu_pressure)


def io_load_factor(boot, io_exponent, pole=1.0):
    """How much the model's I/O term grows an idle boot's I/O part at the boot's load: the
    disk's, and the boots under way beside it sharing it."""
    others = max(0, boot.concurrent_boots)
    return boot_model.io_time(1.0, boot.io_utilisation, io_exponent, pole) * (1 + others)


def halted_seconds(boot):
    """What a boot spent neither running, nor waiting for a CPU, nor for its disks: its guest
    halted, waiting for its timers (1.2-3.0 s of a TCG boot on the all-in-one, whatever the
    disk's load). 0 where its waits are not all known."""
    if boot.cpu_delay_seconds is None or boot.disk_seconds is None:
        return 0.0
    return max(0.0, boot.seconds - boot.cpu_seconds - boot.cpu_delay_seconds
               - boot.disk_seconds)


def needed_seconds(boot):
    """The time a boot's guest needs whatever it waits for: its vCPU's running time and its
    halts (beta_from fits beta to it)."""
    return boot.cpu_seconds + halted_seconds(boot)


def io_seconds(boot, beta, cpus, beta_growth=0.0):
    """What an observed boot took for its I/O: what it took beyond the CPU it needs (``beta``,
    grown with its CPU load by ``beta_growth``) and its wait for a CPU; at least 0.

    The wait for a CPU is the vCPU's own (schedstat's run delay) where it is known. Where it is
    not, the boot's CPU is taken as ``beta`` shared with the boots under way beyond the CPUs,
    and any other wait for a busy CPU counts as I/O: solving the model's CPU part for it gave 0
    for every boot of Nova's on the all-in-one, whose CPU share the model underestimated on a
    lightly loaded host (a boot's vCPU ran 96 % of its time where ``1 - y`` said 78 %), and
    boots slowed by CPU contention alone then inflate it (the all-in-one's two hosts share two
    cores: a host's alpha_yolo rose to 10.7 s from boots that only waited for the CPU the other
    host's fio stressors took).

    Where the boot's disk requests were timed, its I/O part is at most what they took: what is
    left beyond its CPU may be its guest's halts (beta holds them, needed_seconds), which the
    I/O term would otherwise multiply as if they were waits for the disk. A normal boot's vCPU
    under TCG also runs while its reads wait: for it, beta. A boot served from its boot image
    whose waits are all known had the I/O part its requests took, whatever ran meanwhile: its
    few reads and writes overlap its vCPU's running, so that what was left beyond its own vCPU
    time and halts was within that time's noise, 0 for some quiet boots and for some under
    contention. Taken against beta (the median vCPU time of the same image's boots, which
    varies by seconds: 24-37 s on the all-in-one), the faster half had no I/O at all; taken
    against its own vCPU time, two quiet boots of four still had none (alpha_yolo learned 0
    on the emulated HDD, and a host under I/O contention then ranked as fast as an idle one,
    where its boots' requests took three times as long). The prediction counts the overlap
    twice: at most its requests' time, a few percent of a boot at idle."""
    if boot.boot_image and boot.cpu_delay_seconds is not None \
            and boot.disk_seconds is not None:
        return boot.disk_seconds
    need = boot_model.cpu_need(beta, boot.cpu_utilisation, boot.idlest_cpu_utilisation,
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
    from a boot image, alpha and io_pole for the others) and the calibration ``known`` (its
    beta, growth, CPUs and k): the least-absolute-deviation fit of what each boot took for its
    I/O (io_seconds) to the model's ``alpha * L``, ``L`` the I/O term's growth at its load
    (io_load_factor) with the pole ``q`` of ``(1 - x)^q``.

    For a pole, that alpha is the median of the boots' I/O parts brought back to an idle disk,
    ``io_seconds / L``, each weighted by its ``L``. A plain median let the quiet boots decide:
    their I/O part is the noise of a boot's CPU time (a second or so), which the I/O term then
    multiplied by 17 at a utilisation of 0.86, where boots served from their boot image under
    that contention took no longer than on the idle host. Like a median, and unlike least
    squares, one odd boot (a tenant's guest printing its ready line late) moves it no further
    than its weight.

    The pole is fitted where the boots were both quiet and under I/O load (``x`` below and at
    least MIN_FITTED_IO_LOAD): the one of IO_POLES whose fit deviates least, the larger on a
    tie. Boots at one load cannot tell alpha from the pole: then it stays ``pole`` (the
    calibration's, the thesis' 1 by default). With the thesis' pole alone, a host's one loaded
    boot outweighed its quiet ones (its weight is its ``L``, 270 at x 0.99) and set alpha_yolo
    alone: on the all-in-one's emulated HDDs, whose boots from their boot image took 3-8 times
    as long for their requests there, alpha_yolo fell from 0.6 s to 0.005 s, and a host at x
    0.9 then had 0.1 s of I/O predicted, next to none. Fitted together, alpha stays near what
    the quiet boots take (within a step of the poles, and for the boots under way beside a
    loaded one, which share its disk) and the pole says what the disk's load does to them.
    What a tenant's guests move by their requests under load (the pole of their kind, down to
    0 at most, where the I/O part grows by ``e^(k x)`` alone, until the boot ages out of those
    kept) is how that host ranks and passes the filter's limits, nothing else, as for alpha."""
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
    """(beta, beta_growth) from the time boots served from a boot image needed (their vCPU's
    running time and halts: needed_seconds) against their CPU load ``y``: Theil-Sen's line
    ``needed = beta + slope y`` (the median of the slopes between boots at loads at least
    MIN_LOAD_SPREAD apart, then the median intercept), robust to odd boots as a median is;
    ``beta_growth = slope / beta``, within [0, MAX_BETA_GROWTH]. Without ``min_boots`` such
    slopes, or with a slope below 0: (their median needed time, 0).

    Both medians, the intercept's and the needed time's, weigh each boot by its recency, halving
    with every ``half_life`` boots started after it (recency_weights; None: all alike): the CPU
    time one image's boot needs follows the host's speed, which drifts (on the all-in-one, a
    virtual machine on shared hardware, by a quarter within a quarter of an hour: warm-ups of
    24-30 s of vCPU, then boots of 17-23 s, each predicted from the warm-ups too slow), and the
    last boots say more of the next one than older ones. Halving every four boots, the last four
    weigh at least as much as all those before them: beta stays within the range of their
    times, and a tenant's guests must make about that many of the host's last boots to put it
    where they want (with all alike, half of the boots kept); one odd boot among them moves it
    within the range of the others. The slope needs boots at loads apart, which may be old: all
    count alike there."""
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
    return beta, min(slope / beta, boot_model.MAX_BETA_GROWTH)


def cpu_contention_from(boots, cpus, min_boots):
    """c of the model's CPU share ``1 - c y``, from the boots served from a boot image (a normal
    boot's vCPU waits for its reads) with no more boots under way than CPUs (else they share
    them, which the model counts apart); None without ``min_boots`` of them that measure it.

    Where the boots' wait for a CPU is known (schedstat's run delay), a boot's share of a CPU is
    what its vCPU ran of the time it was runnable, ``run / (run + delay)``, which neither a
    guest's halts nor its I/O change, and c is the least-squares fit of ``1 - share = c y`` for
    the load ``y`` the model used for it (cpu_load: the host's CPU pressure, else a CPU's
    utilisation), over every such boot with some load: the boots on busy CPUs, which the
    prediction is for, weigh most (the all-in-one's boots yield nothing to a CPU 20 % busy with
    tasks that mostly sleep, and 40 % of one 70-90 % busy; a median of the ratios, dominated by
    the former, predicted the latter 40 % too fast). The thesis' c = 1 enters the fit as a
    prior worth one boot at a load of 0.5 (CPU_CONTENTION_PRIOR_WEIGHT): a quiet boot's wait
    says next to nothing of c (at a CPU pressure of 0.05 a c of 0.25 or 0.65 changes its share
    of a CPU by 2 %), yet quiet boots alone fitted c near 0.25 on the all-in-one, where its
    boots at 0.5-0.6 waited 35-38 % of their time (c near 0.65): a host's first busy boots were
    predicted 18-39 % too fast from them. Busy boots soon outweigh the prior (two at 0.5 that
    waited 35 % of their time bring it to 0.8). Measured on the all-in-one's two hosts, with
    and without the prior, one run each: mean model error 23 % and 30 % with YOLO's scheduler
    on, 12 % and 14 % with it off, placement the same (docs/scheduling.md).
    Where the run delay is not known, a boot's share is its vCPU time over its wall time,
    taken relative to what such boots got on an idle CPU (their median; 1 without one), since
    under KVM a vCPU also halts and a boot has moments of I/O; c is then the median of
    ``(1 - share) / y`` over the boots on a CPU at least MIN_FITTED_CPU_LOAD busy: a guest that
    halts its vCPU or prints its ready line late is one boot among the median's. Within [0, 1].
    """
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
    """``known`` with the parameters the host's own boots give, each where at least
    ``min_boots`` boots measure it: beta and beta_growth, from the vCPU time (and halts) of boots
    served from a boot image (the CPU a guest needs: under TCG a normal boot's vCPU also spins
    while its reads wait, see from_boots; beta_from); alpha_yolo and alpha, what those and normal
    boots took beyond it, at most their disks' requests, and the I/O term's pole for each kind
    (io_term_from); cpu_contention (see
    cpu_contention_from). ``boots`` are of this host's accelerator; ``beta_half_life``: see
    beta_from."""
    if min_boots <= 0:
        return known
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
        pole_name = boot_model.POLES[name]
        if len(kind) >= min_boots:
            alpha, pole = io_term_from(kind, learned, getattr(known, pole_name))
            fields[name] = round(alpha, 3)
            if pole != getattr(known, pole_name):
                fields[pole_name] = pole
    contention = cpu_contention_from(boots, known.cpus, min_boots)
    if contention is not None:
        fields['cpu_contention'] = contention
    if not fields:
        return known
    details = dict(known.details, observed_boots={'boot_image': len(served),
                                                  'normal': len(normal),
                                                  'learned': sorted(fields)})
    return dataclasses.replace(known, details=details, **fields)
