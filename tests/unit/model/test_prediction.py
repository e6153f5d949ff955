"""The prediction: the thesis' formula, clamping, boot images, concurrent boots."""

import dataclasses
import math

import pytest

from yolo_nova.model import estimators
from yolo_nova.model import parameters
from yolo_nova.model.parameters import BootTimeParameters
from yolo_nova.model import prediction

PARAMS = BootTimeParameters(alpha=8.0, beta=23.0, alpha_yolo=0.5, cpus=2)


def test_idle_host_is_alpha_plus_beta():
    assert prediction.predict(PARAMS, 0, 0) == pytest.approx(31.0)
    assert prediction.predict(PARAMS, 0, 0, boot_image=True) == pytest.approx(23.5)


def test_formula_of_appendix_a():
    x, y = 0.5, 0.25
    expected = math.exp(x) * 8.0 / (1 - x) + 23.0 / (1 - y)
    assert prediction.predict(PARAMS, x, y) == pytest.approx(expected)


def test_io_contention_hurts_a_normal_boot_far_more_than_a_yolo_boot():
    normal = prediction.predict(PARAMS, 0.9, 0)
    yolo = prediction.predict(PARAMS, 0.9, 0, boot_image=True)
    assert normal > 3 * yolo
    # The contention penalty scales with the I/O part: alpha_yolo / alpha of a normal boot's.
    penalty = normal - prediction.predict(PARAMS, 0, 0)
    yolo_penalty = yolo - prediction.predict(PARAMS, 0, 0, boot_image=True)
    assert yolo_penalty == pytest.approx(penalty * 0.5 / 8.0)


@pytest.mark.parametrize('value,clamped', [
    (-0.5, 0.0), (0.0, 0.0), (0.5, 0.5), (1.0, 0.99), (7.0, 0.99),
    (None, 0.0), (float('nan'), 0.0), (float('inf'), 0.0)])
def test_utilisation_is_clamped(value, clamped):
    assert prediction.clamp(value) == clamped


def test_saturated_host_gives_a_large_but_finite_prediction():
    t = prediction.predict(PARAMS, 1.0, 1.0)
    assert math.isfinite(t) and t > 100 * 31.0 / 10


def test_concurrent_boots_share_the_disk_and_then_the_cpus():
    one = prediction.predict(PARAMS, 0, 0)
    # One other boot: the disk is shared (I/O part doubles); 2 boots fit on 2 CPUs.
    assert prediction.predict(PARAMS, 0, 0, concurrent_boots=1) == pytest.approx(2 * 8 + 23)
    # Three others: 4 boots share the disk and 2 CPUs.
    assert prediction.predict(PARAMS, 0, 0, concurrent_boots=3) == pytest.approx(4 * 8 + 2 * 23)
    assert prediction.predict(PARAMS, 0, 0, concurrent_boots=-2) == pytest.approx(one)
    assert prediction.predict(PARAMS, 0, 0, concurrent_boots=None) == pytest.approx(one)


@pytest.mark.parametrize('kwargs', [
    dict(alpha=-1.0), dict(beta=float('nan')), dict(alpha_yolo='3'), dict(cpus=0),
    dict(cpus=1.5), dict(io_pole=1.5), dict(io_pole_yolo=-0.1)])
def test_bad_parameters_are_refused(kwargs):
    values = dict(alpha=1.0, beta=1.0, alpha_yolo=0.0, cpus=1)
    values.update(kwargs)
    with pytest.raises(ValueError):
        BootTimeParameters(**values)


def test_fair_share_floors_the_cpu_part_when_runnable_tasks_are_known():
    params = parameters.BootTimeParameters(alpha=0.0, beta=20.0, alpha_yolo=0.0)
    # A CPU 75 % busy with one other task: the boot still gets half of it, not a quarter.
    assert prediction.predict(params, 0, 0.75) == pytest.approx(80.0)
    assert prediction.predict(params, 0, 0.75, runnable=1.0) == pytest.approx(40.0)
    # Lightly loaded: what the load leaves free is more than the fair share.
    assert prediction.predict(params, 0, 0.2, runnable=1.0) == pytest.approx(25.0)
    # Never faster than idle.
    assert prediction.predict(params, 0, 0.0, runnable=0.0) == pytest.approx(20.0)


def test_the_boot_runs_on_the_idlest_cpu_when_it_is_known():
    params = parameters.BootTimeParameters(alpha=0.0, beta=20.0, alpha_yolo=0.0, cpus=2)
    # Half the host busy: one CPU taken by a running guest, the other idle. The boot gets it.
    assert prediction.predict(params, 0, 0.5, runnable=0.5) == pytest.approx(30.0)
    assert prediction.predict(params, 0, 0.5, runnable=0.5, idlest_cpu=0.0) \
        == pytest.approx(20.0)
    # Both CPUs half busy: the idlest is too, and the fair share still floors it.
    assert prediction.predict(params, 0, 0.5, runnable=0.5, idlest_cpu=0.5) \
        == pytest.approx(30.0)
    assert prediction.predict(params, 0, 0.5, idlest_cpu=float('nan')) == pytest.approx(40.0)


def test_cpu_contention_is_the_share_of_the_cpus_load_a_boot_yields_to():
    thesis = parameters.BootTimeParameters(alpha=0.0, beta=20.0, alpha_yolo=0.0, cpus=2)
    yielding = dataclasses.replace(thesis, cpu_contention=0.2)
    assert prediction.predict(thesis, 0, 0.5, idlest_cpu=0.5) == pytest.approx(40.0)
    assert prediction.predict(yielding, 0, 0.5, idlest_cpu=0.5) == pytest.approx(20.0 / 0.9)
    # Still at least its fair share among the runnable tasks.
    assert prediction.predict(dataclasses.replace(thesis, cpu_contention=1.0), 0, 0.9,
                              runnable=1.0) == pytest.approx(40.0)
    with pytest.raises(ValueError, match='cpu_contention'):
        dataclasses.replace(thesis, cpu_contention=1.5)


def test_cpu_pressure_is_the_load_a_boot_competes_with_where_it_is_known():
    params = parameters.BootTimeParameters(alpha=0.0, beta=20.0, alpha_yolo=0.0, cpus=2,
                                           cpu_contention=0.5)
    # CPUs 80 % busy with tasks that hardly ever wait for one another: the boot hardly waits.
    assert prediction.predict(params, 0, 0.8, idlest_cpu=0.8, cpu_pressure=0.02) \
        == pytest.approx(20.0 / 0.99)
    assert prediction.predict(params, 0, 0.8, idlest_cpu=0.8) == pytest.approx(20.0 / 0.6)
    # Unknown or unusable pressure: the utilisation, as before; clamped like it.
    assert prediction.predict(params, 0, 0.8, idlest_cpu=0.8, cpu_pressure=float('nan')) \
        == pytest.approx(20.0 / 0.6)
    assert prediction.cpu_load(1.0, None, 7.0) == prediction.MAX_UTILISATION
    # Pressure is averaged over the CPUs that are not idle: an idle CPU is the boot's, however
    # long the tasks on the others wait.
    assert prediction.predict(params, 0, 0.5, idlest_cpu=0.0, cpu_pressure=0.9) \
        == pytest.approx(20.0)
    assert prediction.cpu_load(0.5, 0.3, 0.9) == 0.3
    # The fair share among the runnable tasks still floors it.
    thesis = dataclasses.replace(params, cpu_contention=1.0)
    assert prediction.predict(thesis, 0, 0.8, runnable=1.0, cpu_pressure=1.0) \
        == pytest.approx(40.0)


def test_io_exponent_shapes_the_io_part_and_is_measured_back():
    thesis = parameters.BootTimeParameters(alpha=5.0, beta=20.0, alpha_yolo=0.5)
    rate = dataclasses.replace(thesis, io_exponent=0.0)
    assert prediction.predict(rate, 0.5, 0) == pytest.approx(10.0 + 20.0)
    assert prediction.predict(thesis, 0.5, 0) == pytest.approx(math.exp(0.5) * 10.0 + 20.0)
    # k from a loaded boot gives back the time measured.
    loaded = prediction.predict(dataclasses.replace(thesis, io_exponent=0.7), 0.5, 0.1)
    assert estimators.io_exponent_from(thesis, loaded, 0.5, 0.1) == pytest.approx(0.7)
    # Faster than an idle disk would allow, or no I/O part at all: k = 0; never above the cap.
    assert estimators.io_exponent_from(thesis, 21.0, 0.5) == 0.0
    assert estimators.io_exponent_from(thesis, 500.0, 0.5) == parameters.MAX_IO_EXPONENT


def test_the_pole_of_the_io_term_is_each_boot_kinds_own():
    thesis = parameters.BootTimeParameters(alpha=5.0, beta=20.0, alpha_yolo=0.5, io_exponent=0.0)
    assert prediction.io_time(0.5, 0.99, 0.0, pole=0.5) == pytest.approx(0.5 * 10.0)
    learned = dataclasses.replace(thesis, io_pole_yolo=0.5)
    assert prediction.predict(learned, 0.99, 0, boot_image=True) == pytest.approx(5.0 + 20.0)
    assert prediction.predict(learned, 0.99, 0) == prediction.predict(thesis, 0.99, 0)
    normal = dataclasses.replace(thesis, io_pole=0.0)
    assert prediction.predict(normal, 0.99, 0) == pytest.approx(5.0 + 20.0)


def test_the_cpu_a_boot_needs_grows_with_the_load_it_shares_its_cpu_with():
    params = parameters.BootTimeParameters(alpha=0.0, beta=30.0, alpha_yolo=0.0,
                                           cpu_contention=0.5, beta_growth=0.3)
    # At a pressure of 0.6: 30 * (1 + 0.3 * 0.6) = 35.4 s of CPU, at 1 - 0.5 * 0.6 of a CPU.
    assert prediction.predict(params, 0.0, 0.9, cpu_pressure=0.6) == pytest.approx(35.4 / 0.7)
    assert prediction.predict(params, 0.0, 0.0) == 30.0
    with pytest.raises(ValueError, match='beta_growth'):
        dataclasses.replace(params, beta_growth=1.5)


# 2 GiB in Glance, with a boot image; at 1 Gbit/s (125e6 bytes/s) and a conversion at 200e6
# bytes of the download a second (the defaults).
GIB = 1 << 30
IMAGE = prediction.RequestedImage('i', size=2 * GIB, disk_format='qcow2', boot_image=True)


def test_a_host_with_the_base_file_fetches_nothing():
    assert prediction.fetch(PARAMS, IMAGE, True, True, True, 0.05) == prediction.Fetch(
        0.0, 'cached', True)
    assert prediction.fetch(PARAMS, IMAGE, True, False, True, 0.05) == prediction.Fetch(
        0.0, 'cached', False)


def test_a_first_boot_streams_after_fetching_the_boot_image_it_lacks():
    lacking = prediction.fetch(PARAMS, IMAGE, False, False, True, 0.05)
    assert lacking.path == 'streamed' and lacking.boot_image
    assert lacking.seconds == pytest.approx(0.05 * 2 * GIB / 125e6)
    held = prediction.fetch(PARAMS, IMAGE, False, True, True, 0.05)
    assert held == prediction.Fetch(0.0, 'streamed', True)


def test_without_a_boot_image_or_streaming_the_image_is_downloaded_and_converted():
    download = 2 * GIB / 125e6 + 2 * GIB / 200e6
    for image, streams in ((dataclasses.replace(IMAGE, boot_image=False), True),
                           (IMAGE, False)):
        fetched = prediction.fetch(PARAMS, image, False, False, streams, 0.05)
        assert fetched.path == 'download' and not fetched.boot_image
        assert fetched.seconds == pytest.approx(download)
    raw = dataclasses.replace(IMAGE, disk_format='raw', size=8 * GIB, boot_image=False)
    assert prediction.fetch(PARAMS, raw, False, False, True, 0.05).seconds == pytest.approx(
        8 * GIB / 125e6)
    # At 100 Mbit/s, the link's rate dominates.
    slow = dataclasses.replace(PARAMS, glance_bytes_per_second=12.5e6)
    assert prediction.fetch(slow, IMAGE, False, False, False, 0.05).seconds == pytest.approx(
        2 * GIB / 12.5e6 + 2 * GIB / 200e6)


def test_a_size_not_known_fetches_nothing():
    unknown = prediction.RequestedImage('i', disk_format='qcow2', boot_image=True)
    for streams in (True, False):
        assert prediction.fetch(PARAMS, unknown, False, False, streams, 0.05).seconds == 0.0
