import time

import pytest

from yolo_bench import spread


def boot(started_at, vcpu):
    return spread.Boot(started_at=started_at, ended_at=started_at + vcpu + 1, vcpu_seconds=vcpu)


def test_window_mean_takes_the_samples_inside_only():
    samples = [(0, 1.0), (5, 2.0), (10, 4.0)]
    assert spread.window_mean(samples, 0, 10) == 1.5
    assert spread.window_mean(samples, 11, 20) is None


def test_the_windows_are_reports_of_an_age_and_the_boot_itself():
    assert spread.windows(boot(1000, 20)) == {
        'a report 60 s old': (930, 940), 'a report 30 s old': (960, 970),
        'a report 0 s old': (990, 1000), 'during': (1000, 1021)}


def test_median_error_predicts_each_from_the_others():
    assert spread.median_error([20.0, 25.0, 25.0]) == pytest.approx((0.25 + 0.1 + 0.1) / 3)
    assert spread.median_error([30.0, 30.0, 30.0]) == 0


def test_a_line_through_the_others_foretells_a_linear_relation_and_not_noise():
    exact = [(x, 10 + 2 * x) for x in (1.0, 2.0, 4.0, 5.0, 7.0)]
    assert spread.line_error(exact) == pytest.approx(0)
    unrelated = [(1.0, 20.0), (2.0, 30.0), (3.0, 20.0), (4.0, 30.0), (5.0, 20.0)]
    assert spread.line_error(unrelated) > spread.median_error([y for _, y in unrelated])


def test_a_probe_that_slows_with_the_boots_foretells_them_only_from_its_window():
    # Boots 200 s apart whose vCPU time is 20 s times the probe's time during them; the
    # probe is flat before each boot, so a report of it foretells nothing.
    speeds = [1.0, 1.5, 1.2, 0.9, 1.1]
    boots = [boot(200 * (i + 1), 20 * s) for i, s in enumerate(speeds)]
    samples = [(200 * (i + 1) - w, 0.1) for i in range(len(speeds)) for w in (65, 35, 5)]
    samples += [(200 * (i + 1) + 2 * j, 0.1 * s) for i, s in enumerate(speeds) for j in range(3)]
    lines = spread.summary(boots, samples)
    assert lines[0].startswith('5 boots: vCPU 18.0-30.0 s (median 22.0 s)')
    assert lines[1:4] == ['probe, a report %d s old: constant' % age for age in (60, 30, 0)]
    assert lines[4].startswith('probe, during (5 boots): correlation with vCPU time 1.00; '
                               'each predicted from a line through the others: 0.0%')


def test_too_few_samples_are_said():
    boots = [boot(100, 20.0), boot(200, 22.0), boot(300, 21.0), boot(400, 23.0)]
    lines = spread.summary(boots, [(150, 0.1)])
    assert 'probe, during: too few samples' in lines


def test_arguments():
    for wrong in (['--boots', '3'], ['--ready-pattern', '('], ['--probe-interval', '0'],
                  ['--pause', '-1']):
        with pytest.raises(SystemExit):
            spread.parse_args(['--image', __file__] + wrong)
    args = spread.parse_args(['--image', __file__, '--ready-pattern', 'login: ?$'])
    assert args.ready_pattern.search(b'host login: ')


def test_the_probe_samples_until_stopped():
    with spread.Probe(interval=0.01) as probe:
        deadline = time.monotonic() + 30
        while len(probe.samples) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(probe.samples) >= 2
    assert all(seconds > 0 for _, seconds in probe.samples)
    count = len(probe.samples)
    time.sleep(0.1)
    assert len(probe.samples) == count
