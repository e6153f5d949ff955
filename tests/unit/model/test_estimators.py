"""The estimators: parameters from idle boots and from the boots a host timed."""

import dataclasses

import pytest

from yolo_nova.model import calibration
from yolo_nova.model import estimators
from yolo_nova.model import parameters
from yolo_nova.model import prediction


def test_calibration_from_idle_boots():
    params = estimators.calibrate(idle_boot_s=31.1, idle_cpu_s=23.2, idle_yolo_boot_s=23.4,
                                  cpus=2)
    assert params.beta == pytest.approx(23.2)
    assert params.alpha == pytest.approx(7.9)
    assert params.alpha_yolo == pytest.approx(0.2)
    # A YOLO boot faster than its CPU time (noise) does not give a negative I/O part.
    assert estimators.calibrate(30, 23.5, 23.0, 1).alpha_yolo == 0.0


def observed(seconds, cpu_seconds, boot_image, io=0.0, cpu=0.0, runnable=None, others=0,
             idlest=None, delay=None, pressure=None, disk=None):
    return estimators.ObservedBoot(
        started_at=0.0, seconds=seconds, cpu_seconds=cpu_seconds, boot_image=boot_image,
        io_utilisation=io, cpu_utilisation=cpu, runnable=runnable, concurrent_boots=others,
        idlest_cpu_utilisation=idlest, cpu_delay_seconds=delay, cpu_pressure=pressure,
        disk_seconds=disk)


def test_observed_boots_are_brought_back_to_an_idle_host_through_the_model():
    known = calibration.Calibration(alpha=5.0, beta=20.0, alpha_yolo=0.5, cpus=2,
                                    io_exponent=0.0)
    # The true host: beta 30, alpha 8, alpha_yolo 1. Boots under I/O load x take
    # alpha / (1 - x) for their I/O (k = 0), and with one other boot under way twice the I/O
    # part (the CPU part only beyond the 2 CPUs). A boot under CPU load y, beta / (1 - y),
    # counts its wait for the CPU as I/O: the median leaves it out.
    boots = [observed(31.0, 30.0, True), observed(30.0 + 1.0 / 0.5, 30.2, True, io=0.5),
             observed(30.0 / 0.6 + 1.0, 29.8, True, cpu=0.4),
             observed(38.0, 45.0, False), observed(30.0 + 8.0 / 0.2, 60.0, False, io=0.8),
             observed(30.0 + 2 * 8.0, 40.0, False, others=1)]
    learned = estimators.with_observed_boots(known, boots, min_boots=3)
    assert (learned.alpha, learned.beta, learned.alpha_yolo) == (8.0, 30.0, 1.0)
    assert learned.details['observed_boots'] == {'boot_image': 3, 'normal': 3, 'streamed': 0,
                                                 'learned': ['alpha', 'alpha_yolo', 'beta']}
    assert (learned.cpus, learned.io_exponent) == (2, 0.0)


def test_first_boots_before_the_download_give_the_streamed_boot_factor_alone():
    known = calibration.Calibration(alpha=5.0, beta=20.0, alpha_yolo=0.5, cpus=2,
                                    io_exponent=0.0)
    # Served from their boot images, the same boots with their base files held would take
    # 20.5 s idle and 20.5 + 0.5 / 0.5 s at an I/O load of 0.5: these took 1.6, 1.5 and 2
    # times that.
    streamed = [dataclasses.replace(boot, streamed=True) for boot in (
        observed(32.8, 20.0, True), observed(21.5 * 1.5, 20.0, True, io=0.5),
        observed(41.0, 20.0, True))]
    learned = estimators.with_observed_boots(known, streamed, min_boots=3)
    assert learned.streamed_boot_factor == 1.6
    # They teach nothing else: not beta, nor alpha_yolo, from boots the download slowed.
    assert (learned.alpha, learned.beta, learned.alpha_yolo) == (5.0, 20.0, 0.5)
    assert learned.details['observed_boots'] == {'boot_image': 0, 'normal': 0, 'streamed': 3,
                                                 'learned': ['streamed_boot_factor']}
    # Too few: the default; a boot faster than held counts as no slower.
    assert estimators.with_observed_boots(known, streamed[:2], min_boots=3) == known
    fast = [dataclasses.replace(observed(10.0, 10.0, True), streamed=True)]
    assert estimators.with_observed_boots(known, fast, 1).streamed_boot_factor == 1.0


def test_too_few_observed_boots_leave_the_parameters_as_they_were(tmp_path):
    known = calibration.Calibration(alpha=5.0, beta=20.0, alpha_yolo=0.5, cpus=1)
    boots = [observed(31.0, 30.0, True), observed(38.0, 45.0, False)]
    assert estimators.with_observed_boots(known, boots, min_boots=2) == known
    assert estimators.with_observed_boots(known, boots * 2, min_boots=0) == known
    # A boot faster than its CPU part gives an I/O part of 0, never a negative one.
    fast = estimators.with_observed_boots(known, [observed(10.0, 30.0, False)], min_boots=1)
    assert fast.alpha == 0.0


def test_cpu_contention_is_fitted_to_the_share_of_a_cpu_the_boots_got():
    known = calibration.Calibration(alpha=5.0, beta=20.0, alpha_yolo=0.5, cpus=2)
    # Served boots whose vCPU ran 90 % of the time on a CPU 25 % busy, 80 % at 50 %, all of
    # it on an idle one: a boot yields to 40 % of the load (1 - 0.4 y).
    boots = [observed(30.0, 27.0, True, cpu=0.9, idlest=0.25),
             observed(30.0, 24.0, True, cpu=0.1, idlest=0.5),
             observed(30.0, 27.0, True, cpu=0.25),
             observed(30.0, 30.0, True, idlest=0.0),
             # Normal (its reads wait), or sharing the CPUs with other boots: neither tells.
             observed(60.0, 20.0, False, cpu=0.5), observed(60.0, 20.0, True, cpu=0.5, others=2)]
    assert estimators.cpu_contention_from(boots, cpus=2, min_boots=3) == 0.4
    assert estimators.cpu_contention_from(boots, cpus=2, min_boots=4) is None
    learned = estimators.with_observed_boots(known, boots, min_boots=3)
    assert learned.cpu_contention == 0.4
    assert learned.params.cpu_contention == 0.4
    assert 'cpu_contention' in learned.details['observed_boots']['learned']
    # A guest that halts its vCPU (or prints its ready line late) is one boot of the median.
    halting = boots + [observed(30.0, 6.0, True, cpu=0.5)]
    assert estimators.cpu_contention_from(halting, cpus=2, min_boots=3) == 0.4
    # Shares are relative to an idle CPU's: under KVM a vCPU halts for part of any boot.
    kvm = [observed(30.0, 0.8 * 30.0, True), observed(30.0, 0.72 * 30.0, True, cpu=0.25),
           observed(30.0, 0.64 * 30.0, True, cpu=0.5), observed(30.0, 0.72 * 30.0, True, cpu=0.25)]
    assert estimators.cpu_contention_from(kvm, cpus=2, min_boots=3) == 0.4
    # Bounded: at most the thesis' 1, at least 0.
    slow = [observed(30.0, 10.0, True, cpu=0.5)] * 3
    assert estimators.cpu_contention_from(slow, cpus=2, min_boots=3) == 1.0
    fast = [observed(30.0, 31.0, True, cpu=0.5)] * 3
    assert estimators.cpu_contention_from(fast, cpus=2, min_boots=3) == 0.0


def test_a_known_wait_for_the_cpu_is_not_taken_for_io():
    known = calibration.Calibration(alpha=5.0, beta=20.0, alpha_yolo=0.5, cpus=2,
                                    io_exponent=0.0)
    # The true host: beta 30, alpha_yolo 1. Two boots waited 20 s and 15 s for a CPU another
    # host's work took (no I/O load, no boot under way): without their run delay their waits
    # would make alpha_yolo 21 s and 16 s, and the median 16.
    boots = [observed(51.0, 30.0, True, delay=20.0), observed(46.0, 30.0, True, delay=15.0),
             observed(31.0, 30.0, True, delay=0.0)]
    learned = estimators.with_observed_boots(known, boots, min_boots=3)
    assert (learned.beta, learned.alpha_yolo) == (30.0, 1.0)
    unknown = [dataclasses.replace(boot, cpu_delay_seconds=None) for boot in boots]
    assert estimators.with_observed_boots(known, unknown, min_boots=3).alpha_yolo == 16.0
    # A normal boot under TCG spins its vCPU while its reads wait: its I/O is what is left
    # beyond beta and its wait for a CPU.
    normal = [observed(30.0 + 8.0 + 5.0, 36.0, False, delay=5.0)] * 3
    assert estimators.with_observed_boots(learned, normal, min_boots=3).alpha == 8.0


def test_cpu_contention_from_the_vcpus_own_wait_for_a_cpu():
    # The vCPU ran 27 s of the 30 s it was runnable on a CPU 25 % busy, 24 of 30 at 50 %: it
    # yields to 40 % of the load, whatever it halted or waited for I/O meanwhile (the wall time
    # does not enter), and without idle boots to compare with.
    # The thesis' c = 1 counts as one boot at a load of 0.5: three such boots move c from 1 to
    # 0.64, twelve to 0.49, on their way to 0.4.
    boots = [observed(40.0, 27.0, True, cpu=0.25, delay=3.0),
             observed(45.0, 24.0, True, cpu=0.5, delay=6.0),
             observed(33.0, 27.0, True, cpu=0.25, delay=3.0)]
    assert estimators.cpu_contention_from(boots, cpus=2, min_boots=3) == 0.64
    assert estimators.cpu_contention_from(boots * 4, cpus=2, min_boots=3) == 0.486
    # Idle boots with their delay known are not needed as a reference, nor taken as one.
    assert estimators.cpu_contention_from(
        boots + [observed(60.0, 20.0, True, delay=0.0)], cpus=2, min_boots=3) == 0.64
    # Fitted by least squares: the boots on busy CPUs weigh most. On the all-in-one, boots on
    # CPUs about 20 % busy got all of it, boots on CPUs 70-87 % busy about 63 %: the median of
    # the ratios (0.05) would predict the latter 40 % too fast.
    all_in_one = [observed(31.2, 30.3, True, idlest=0.23, delay=0.3),
                  observed(32.2, 30.6, True, idlest=0.17, delay=0.5),
                  observed(29.1, 28.6, True, idlest=0.20, delay=0.2),
                  observed(27.1, 25.9, True, idlest=0.21, delay=0.2),
                  observed(53.4, 34.2, True, idlest=0.70, delay=18.8),
                  observed(52.3, 32.0, True, idlest=0.87, delay=19.8)]
    assert estimators.cpu_contention_from(all_in_one, cpus=2, min_boots=3) == 0.504
    # Quiet boots barely move the thesis' 1: boots that waited 1 % of their time at a CPU
    # pressure of 0.04 (c 0.25 alone) say little of a busy CPU, where the all-in-one's boots
    # waited 35-38 % at 0.5-0.6; each such boot moves it towards what it measured (0.69).
    quiet = [observed(30.0, 29.7, True, cpu=0.3, pressure=0.04, delay=0.3)] * 3
    assert estimators.cpu_contention_from(quiet, cpus=2, min_boots=3) == 0.986
    busy = observed(50.0, 31.0, True, cpu=0.9, pressure=0.55, delay=19.0)
    assert estimators.cpu_contention_from(quiet + [busy], cpus=2, min_boots=3) == 0.826
    # No load at all measures nothing.
    assert estimators.cpu_contention_from(
        [observed(30.0, 29.7, True, delay=0.3)] * 3, cpus=2, min_boots=3) is None


def test_cpu_contention_is_fitted_to_the_cpu_pressure_where_hosts_report_it():
    # The all-in-one's CPUs 70-90 % busy: with runnable work (fio on a loop device over memory)
    # a boot's vCPU waited 19 s of 52; with tasks that mostly sleep (fio on a disk), hardly at
    # all. Against utilisation no c fits both; against the pressure their load put on the CPUs,
    # one does.
    busy = [observed(52.0, 32.0, True, idlest=0.85, delay=19.0, pressure=0.6),
            observed(51.0, 32.0, True, idlest=0.80, delay=18.5, pressure=0.58)]
    boots = busy * 2 + [observed(40.0, 31.0, True, idlest=0.85, delay=1.0, pressure=0.05),
                        observed(39.0, 31.0, True, idlest=0.80, delay=0.8, pressure=0.04)]
    c = estimators.cpu_contention_from(boots, cpus=2, min_boots=2)
    assert c == pytest.approx(0.68, abs=0.01)
    for boot in boots:
        share = boot.cpu_seconds / (boot.cpu_seconds + boot.cpu_delay_seconds)
        assert prediction.cpu_share(boot.cpu_utilisation, idlest_cpu=boot.idlest_cpu_utilisation,
                                    contention=c, pressure=boot.cpu_pressure) \
            == pytest.approx(share, abs=0.05)
    # The same boots without their pressure: the fit to utilisation misses the quiet ones by
    # a third.
    blind = [dataclasses.replace(boot, cpu_pressure=None) for boot in boots]
    c = estimators.cpu_contention_from(blind, cpus=2, min_boots=2)
    assert prediction.cpu_share(0, idlest_cpu=0.85, contention=c) < 0.8


def test_observed_boots_file_keeps_the_last_ones(tmp_path):
    path = str(tmp_path / 'state' / 'observed-boots.json')
    assert estimators.load_observed(path) == []
    boots = [observed(float(i), 1.0, False) for i in range(30)]
    estimators.save_observed(boots, path)
    assert estimators.load_observed(path) == boots[-estimators.OBSERVED_BOOTS_KEPT:]
    # First boots before the download are kept apart: the others do not push them out.
    streamed = [dataclasses.replace(observed(float(i), 1.0, True), streamed=True)
                for i in range(100, 115)]
    estimators.save_observed(streamed[:3] + boots + streamed[3:], path)
    assert estimators.load_observed(path) == (boots[-estimators.OBSERVED_BOOTS_KEPT:]
                                              + streamed[-estimators.STREAMED_BOOTS_KEPT:])
    (tmp_path / 'state' / 'observed-boots.json').write_text('[{"seconds": 1}]')
    with pytest.raises(ValueError, match='not a list of observed boots'):
        estimators.load_observed(path)


def test_alpha_yolo_follows_the_boots_under_io_load_that_it_is_multiplied_for():
    known = calibration.Calibration(alpha=5.0, beta=30.0, alpha_yolo=0.5, cpus=2)
    # Quiet boots 1-2 s beyond their CPU (noise of the CPU time); boots served from their boot
    # image under I/O load 0.86 (the term e^x / (1 - x) is 16.9 there) took 1 s longer: their
    # I/O part does not grow with the contention.
    quiet = [observed(30.0 + extra, 30.0, True, delay=0.0) for extra in (1.0, 1.5, 2.0, 1.2)]
    loaded = [observed(31.0, 30.0, True, io=0.86, delay=0.0) for _ in range(2)]

    def io_at(learned, x):
        return prediction.io_time(learned.alpha_yolo, x, learned.io_exponent,
                                  learned.io_pole_yolo)
    learned = estimators.with_observed_boots(known, quiet + loaded, min_boots=3)
    assert io_at(learned, 0.86) == pytest.approx(1.0, abs=1e-3)
    assert learned.io_pole_yolo == 0.0      # no growth but k's e^x
    # Quiet boots alone: their median, and the thesis' pole.
    learned = estimators.with_observed_boots(known, quiet, min_boots=3)
    assert (learned.alpha_yolo, learned.io_pole_yolo) == (1.2, 1.0)
    # One odd boot under load (its guest printed its ready line 60 s late) among four: the fit
    # keeps to the boots that agree, where least squares would add a quarter of its excess.
    odd = observed(91.0, 30.0, True, io=0.86, delay=0.0)
    learned = estimators.with_observed_boots(known, quiet + loaded + [loaded[0], odd],
                                             min_boots=3)
    assert io_at(learned, 0.86) == pytest.approx(1.0, abs=1e-3)


def test_weighted_median():
    assert estimators.weighted_median([(3.0, 1.0), (1.0, 1.0), (2.0, 1.0)]) == 2.0
    assert estimators.weighted_median([(1.0, 1.0), (5.0, 3.0)]) == 5.0
    with pytest.raises(ValueError):
        estimators.weighted_median([])


def test_beta_and_its_growth_are_fitted_to_the_vcpu_time_against_the_cpu_load():
    known = calibration.Calibration(alpha=5.0, beta=20.0, alpha_yolo=0.5, cpus=2)
    # vCPU time 30 s on a quiet CPU, 30 (1 + 0.3 p) at a pressure p; one odd boot (a guest
    # spinning before its ready line) does not move the fit.
    boots = [observed(60.0, 30.0 * (1 + 0.3 * p), True, cpu=0.9, pressure=p, delay=5.0)
             for p in (0.0, 0.0, 0.05, 0.5, 0.6)]
    boots.append(observed(90.0, 80.0, True, cpu=0.9, pressure=0.3, delay=1.0))
    learned = estimators.with_observed_boots(known, boots, min_boots=3)
    assert (learned.beta, learned.beta_growth) == (pytest.approx(30.0, abs=0.01),
                                                   pytest.approx(0.3, abs=0.01))
    assert 'beta_growth' in learned.details['observed_boots']['learned']
    # Loads too close to each other say nothing of the growth: the median vCPU time, no growth.
    close = [observed(60.0, vcpu, True, cpu=0.9, pressure=0.05, delay=1.0)
             for vcpu in (29.0, 30.0, 33.0)]
    learned = estimators.with_observed_boots(known, close, min_boots=3)
    assert (learned.beta, learned.beta_growth) == (30.0, 0.0)
    # Less CPU on a busier CPU: no growth either (never a negative one).
    shrinking = [observed(60.0, 30.0 - 5 * p, True, cpu=0.9, pressure=p, delay=1.0)
                 for p in (0.0, 0.3, 0.6)]
    assert estimators.with_observed_boots(known, shrinking, min_boots=3).beta_growth == 0.0
    # The growth is capped.
    steep = [observed(60.0, 10.0 + 90 * p, True, cpu=0.9, pressure=p, delay=1.0)
             for p in (0.0, 0.5, 0.9)]
    learned = estimators.with_observed_boots(known, steep, min_boots=3)
    assert learned.beta_growth == parameters.MAX_BETA_GROWTH


def test_beta_follows_the_hosts_last_boots():
    known = calibration.Calibration(alpha=5.0, beta=20.0, alpha_yolo=0.5, cpus=2)

    def boots(*needed):
        return [dataclasses.replace(observed(vcpu + 1.0, vcpu, True, delay=0.5, disk=0.5),
                                    started_at=float(i)) for i, vcpu in enumerate(needed)]
    # The host sped up: four boots of 30 s of vCPU, then three of 24 s. All alike, the median is
    # the old speed; halving every four boots, the new one.
    drifted = boots(30.0, 30.0, 30.0, 30.0, 24.0, 24.0, 24.0)
    assert estimators.with_observed_boots(known, drifted, 3).beta == 24.0
    assert estimators.with_observed_boots(known, drifted, 3, beta_half_life=None).beta == 30.0
    # One odd boot among the last four moves it within the range of the others' times, where
    # the boots' order is their start, not the list's.
    odd = drifted + [dataclasses.replace(b, started_at=7.0 + i)
                     for i, b in enumerate(boots(24.0, 80.0))]
    for order in (odd, odd[::-1]):
        assert estimators.with_observed_boots(known, order, 3).beta == 24.0
    # With three of them, the oldest of its last four boots is the old speed's.
    assert estimators.with_observed_boots(known, odd[:7] + odd[8:], 3).beta == 30.0
    assert estimators.recency_weights(odd[::-1], 4)[0] == 1.0
    # The intercept of beta's line is weighed alike: boots at two loads, the last ones faster.
    sloped = [dataclasses.replace(b, cpu_pressure=load, cpu_utilisation=0.9)
              for b, load in zip(drifted, (0.0, 0.5, 0.0, 0.5, 0.0, 0.5, 0.0))]
    sloped = [dataclasses.replace(b, cpu_seconds=b.cpu_seconds + 6.0 * b.cpu_pressure)
              for b in sloped]
    learned = estimators.with_observed_boots(known, sloped, 3)
    assert (learned.beta, learned.beta_growth) == (24.0, pytest.approx(6.0 / 24.0))
    learned = estimators.with_observed_boots(known, sloped, 3, beta_half_life=None)
    assert learned.beta == 30.0
    with pytest.raises(ValueError):
        estimators.recency_weights(odd, 0)


def test_a_guests_halts_are_not_taken_for_io_where_its_disk_requests_were_timed():
    known = calibration.Calibration(alpha=5.0, beta=20.0, alpha_yolo=0.5, cpus=2)
    # Quiet boots served from their boot image: 30 s of vCPU, 2 s halted (the guest waiting for
    # its timers), 0.5 s of disk requests. Without the disk's count the 2.5 s beyond the vCPU
    # time would be alpha_yolo, which the I/O term multiplies by 17 at x 0.86.
    quiet = [observed(32.5, 30.0, True, delay=0.0, disk=0.5) for _ in range(3)]
    learned = estimators.with_observed_boots(known, quiet, min_boots=3)
    assert (learned.beta, learned.alpha_yolo) == (32.0, 0.5)
    assert estimators.halted_seconds(quiet[0]) == 2.0
    untimed = [dataclasses.replace(boot, disk_seconds=None) for boot in quiet]
    learned = estimators.with_observed_boots(known, untimed, min_boots=3)
    assert (learned.beta, learned.alpha_yolo) == (30.0, 2.5)
    # The requests of a normal boot under load overlap (QEMU reads ahead): their sum is more
    # than its wait, and what is left beyond its CPU is its I/O part.
    normal = [observed(32.0 + 40.0, 60.0, False, io=0.8, delay=0.0, disk=90.0)] * 3
    learned = estimators.with_observed_boots(
        dataclasses.replace(known, beta=32.0, io_exponent=0.0), normal, min_boots=3)
    assert learned.alpha == pytest.approx(40.0 * 0.2)


def served_boots(*timings):
    """Quiet boots served from their boot image, from (seconds, vCPU, run delay, disk)."""
    return [observed(seconds, vcpu, True, delay=delay, disk=disk)
            for seconds, vcpu, delay, disk in timings]


def test_a_boot_from_its_boot_image_has_the_io_part_its_requests_took():
    known = calibration.Calibration(alpha=5.0, beta=30.0, alpha_yolo=0.5, cpus=2)
    # The all-in-one's warm-ups of one image: vCPU 23.5-31.9 s, their disks 0.47-0.88 s. Taken
    # against the median vCPU time (beta), the faster half left nothing for I/O and alpha_yolo
    # came out 0: a host under I/O contention then ranked as fast as an idle one.
    warm_ups = served_boots((24.6, 23.5, 0.3, 0.47), (28.0, 26.7, 0.36, 0.58),
                            (25.2, 24.1, 0.32, 0.47), (34.3, 31.9, 0.8, 0.88))
    learned = estimators.with_observed_boots(known, warm_ups, min_boots=3)
    assert learned.alpha_yolo == 0.47
    # Warm-ups on the emulated HDD whose requests overlapped their vCPU's running: two of four
    # left nothing beyond their vCPU time and wait, yet their requests took 0.4-0.5 s. Under
    # contention (x 0.99) the same boot's requests took 2.5 s: the I/O part is what they took,
    # so that the contended host ranks behind an idle one, by what its disk costs.
    overlapped = served_boots((26.5, 26.2, 0.3, 0.45), (30.1, 29.7, 0.4, 0.43),
                              (25.1, 24.0, 0.3, 0.46), (28.3, 27.6, 0.3, 0.42))
    learned = estimators.with_observed_boots(known, overlapped, min_boots=3)
    assert learned.alpha_yolo == 0.43
    loaded = observed(27.2, 25.7, True, io=0.99, delay=0.4, disk=2.46)
    learned = estimators.with_observed_boots(known, overlapped + [loaded], min_boots=3)
    # Fitted with the pole of its I/O term: alpha_yolo stays what the quiet boots' requests
    # took, and the I/O part at x 0.99 is the loaded boot's, where the thesis' pole alone took
    # alpha_yolo down to 0.009 s and left a host at x 0.9 next to no I/O (0.2 s).

    def io_at(x):
        return prediction.io_time(learned.alpha_yolo, x, learned.io_exponent,
                                  learned.io_pole_yolo)
    assert 0.43 <= learned.alpha_yolo <= 0.46 and learned.io_pole_yolo == 0.15
    assert io_at(0.99) == pytest.approx(2.46, rel=0.03)
    assert io_at(0.99) > io_at(0.0) + 2.0 and io_at(0.9) > 1.5
    thesis = estimators.io_load_factor(loaded, known.io_exponent)
    assert prediction.io_time(2.46 / thesis, 0.9) < 0.25
    # Boots at one load alone cannot tell alpha from the pole: it stays the calibration's.
    saturated = [dataclasses.replace(loaded, disk_seconds=disk) for disk in (2.4, 2.5, 2.46)]
    for pole in (1.0, 0.3):
        learned = estimators.with_observed_boots(
            dataclasses.replace(known, io_pole_yolo=pole), saturated, min_boots=3)
        assert learned.io_pole_yolo == pole
    # One from the calibration file gives way to the boots' fit, the thesis' 1 included.
    grown = dataclasses.replace(loaded, disk_seconds=0.44 * prediction.io_time(1.0, 0.99))
    learned = estimators.with_observed_boots(dataclasses.replace(known, io_pole_yolo=0.3),
                                             overlapped + [grown], min_boots=3)
    assert (learned.io_pole_yolo, learned.alpha_yolo) == (1.0, 0.44)
    assert 'io_pole_yolo' in learned.details['observed_boots']['learned']
    # Without its waits all known, a boot is still taken against beta.
    unknown = [dataclasses.replace(boot, disk_seconds=None) for boot in warm_ups]
    assert estimators.with_observed_boots(known, unknown, min_boots=3).alpha_yolo == 0.0


def test_normal_boots_have_a_pole_of_their_own():
    known = calibration.Calibration(alpha=5.0, beta=30.0, alpha_yolo=0.5, cpus=2,
                                    io_exponent=0.0)
    # Normal boots waiting 6 s on their reads when quiet, 60 s at x 0.99: ten times, a pole of
    # 0.5. Boots from their boot image beside them keep the thesis'.
    normal = [observed(30.0 + 6.0, 30.0, False, delay=0.0) for _ in range(3)]
    normal.append(observed(30.0 + 60.0, 30.0, False, io=0.99, delay=0.0))
    served = [observed(30.5, 30.0, True, delay=0.0, disk=0.5) for _ in range(3)]
    learned = estimators.with_observed_boots(known, normal + served, min_boots=3)
    assert (learned.alpha, learned.io_pole) == (6.0, 0.5)
    assert (learned.alpha_yolo, learned.io_pole_yolo) == (0.5, 1.0)


def test_a_hosts_parameters_by_precedence_file_then_boots_then_settings():
    known = calibration.Calibration(alpha=5.0, beta=20.0, alpha_yolo=0.5, cpus=2,
                                    io_exponent=0.5, io_pole_yolo=0.3)
    unset = dict.fromkeys(['alpha', 'beta', 'alpha_yolo', 'io_exponent', 'disk_iops',
                           'disk_bytes_per_second'])
    # Served boots give beta 30 and alpha_yolo 1; normal boots under I/O load 0.5 took 8 s
    # beyond beta for their I/O.
    boots = [observed(31.0, 30.0, True)] * 3 + [observed(38.0, 40.0, False, io=0.5)] * 3
    learned = estimators.host_calibration(known, boots, 3, unset)
    assert learned == estimators.with_observed_boots(known, boots, 3)
    assert (learned.beta, learned.alpha_yolo, learned.io_pole_yolo) == (30.0, 1.0, 0.3)
    # A setting wins over what the boots give, and an I/O part set has the thesis' pole.
    chosen = estimators.host_calibration(
        known, boots, 3, dict(unset, beta=25.0, alpha_yolo=0.8, disk_iops=100.0))
    assert (chosen.beta, chosen.alpha_yolo, chosen.io_pole_yolo, chosen.disk_iops) == (
        25.0, 0.8, 1.0, 100.0)
    assert chosen.alpha == learned.alpha
    # k, which the boots do not give, is set before they are brought back to an idle disk.
    flat = estimators.host_calibration(known, boots, 3, dict(unset, io_exponent=0.0))
    assert flat.io_exponent == 0.0
    assert flat.alpha == pytest.approx(8.0 * 0.5) != learned.alpha
