import time

import pytest

from yolo_bench import spread


def boot(started_at, vcpu):
    return spread.Boot(started_at=started_at, ended_at=started_at + vcpu + 1, seconds=vcpu + 1,
                       vcpu_seconds=vcpu)


def test_window_mean_takes_the_samples_inside_only():
    samples = [(0, 1.0), (5, 2.0), (10, 4.0)]
    assert spread.window_mean(samples, 0, 10) == 1.5
    assert spread.window_mean(samples, 11, 20) is None


def test_own_median_error():
    assert spread.own_median_error([20.0, 25.0, 25.0]) == pytest.approx(0.25 / 3)
    assert spread.own_median_error([30.0, 30.0, 30.0]) == 0


def test_a_probe_that_slows_with_the_boots_divides_their_spread_out():
    # Boots 100 s apart whose vCPU time is 20 s times the probe's time during them; the probe
    # before each boot is flat, so it foretells nothing.
    speeds = [1.0, 1.5, 1.2, 0.9, 1.1]
    boots = [boot(100 * (i + 1), 20 * s) for i, s in enumerate(speeds)]
    samples = [(100 * (i + 1) - w, 0.1) for i in range(len(speeds)) for w in (50, 20, 5)]
    samples += [(100 * (i + 1) + 2 * j, 0.1 * s) for i, s in enumerate(speeds) for j in range(3)]
    lines = spread.summary(boots, samples)
    assert lines[0].startswith('5 boots: vCPU 18.0-30.0 s (median 22.0 s)')
    during = [line for line in lines if line.startswith('probe during')]
    assert during == ["probe during: correlation with vCPU time 1.00; vCPU divided by the "
                      "probe's relative time, own median as the prediction: 0.0%"]
    assert 'probe 10 s before: constant' in lines


def test_too_few_samples_are_said():
    boots = [boot(100, 20.0), boot(200, 22.0), boot(300, 21.0)]
    lines = spread.summary(boots, [(150, 0.1)])
    assert 'probe during: too few samples' in lines


def test_arguments():
    with pytest.raises(SystemExit):
        spread.parse_args(['--image', __file__, '--boots', '2'])
    with pytest.raises(SystemExit):
        spread.parse_args(['--image', __file__, '--ready-pattern', '('])
    args = spread.parse_args(['--image', __file__, '--ready-pattern', 'login: ?$'])
    assert args.ready_pattern.search(b'host login: ')


def test_the_probe_samples_until_stopped():
    with spread.Probe(interval=0.01) as probe:
        deadline = time.monotonic() + 30
        while len(probe.samples) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(probe.samples) >= 2
    count = len(probe.samples)
    assert all(seconds > 0 for _, seconds in probe.samples)
    assert len(probe.samples) == count
