"""The Nova-level boot benchmark's arguments and report (its boots run on the all-in-one:
bench/aio/boot-times)."""

import dataclasses
import re
from unittest import mock

import pytest

from yolo_bench import cloud
from yolo_bench.cloud import Boot


def boots(policy, stressors, servers, seconds):
    return [Boot(policy, stressors, servers, rep, s - 10, s, 'none')
            for rep, s in enumerate(seconds, 1)]


def test_summary_compares_each_policy_with_yolo_in_the_same_condition():
    measured = (boots('off', 0, 1, [40, 44, 42]) + boots('on', 0, 1, [40, 41, 39]) +
                boots('warm', 0, 1, [38, 39, 40]) + boots('off', 8, 1, [300, 330, 320]) +
                boots('on', 8, 1, [50, 52, 49]) + boots('warm', 8, 1, [310, 290, 300]))
    lines = cloud.summary(measured).splitlines()
    assert lines[0] == ('| I/O stressors | servers at once | cache | off: ready s (min-max), '
                        'ACTIVE s | on: ready s (min-max), ACTIVE s | warm: ready s (min-max), '
                        'ACTIVE s | off / on | warm / on |')
    assert lines[2] == ('| 0 | 1 | none | 42.0 (40.0-44.0), 32.0 | 40.0 (39.0-41.0), 30.0 '
                        '| 39.0 (38.0-40.0), 29.0 | 1.05 | 0.97 |')
    assert lines[3] == ('| 8 | 1 | none | 320.0 (300.0-330.0), 310.0 | 50.0 (49.0-52.0), 40.0 '
                        '| 300.0 (290.0-310.0), 290.0 | 6.40 | 6.00 |')
    assert lines[-1] == 'YOLO on with 8 stressors, 1 server / YOLO on idle: 1.25'


def test_stressors_need_the_emulated_hdd(capsys):
    # By default, the emulated HDD idle and under 8 stressors: where YOLO matters.
    args = cloud.parse_args([])
    assert (args.storage, args.stressors) == ('hdd', [0, 8])
    assert cloud.parse_args(['--storage', 'local']).stressors == [0]
    with pytest.raises(SystemExit):
        cloud.parse_args(['--storage', 'local', '--stressors', '0,8'])
    assert '--stressors needs --storage hdd' in capsys.readouterr().err
    args = cloud.parse_args(['--storage', 'hdd', '--stressors', '0,8', '--servers', '1,3',
                             '--policies', 'off,on'])
    assert (args.stressors, args.servers, args.policies) == ([0, 8], [1, 3], ['off', 'on'])


def test_unknown_policies_are_refused(capsys):
    with pytest.raises(SystemExit):
        cloud.parse_args(['--policies', 'on,fast'])
    assert 'unknown policy fast' in capsys.readouterr().err


def admin_of(properties):
    """An admin connection to whom every image has ``properties``."""
    admin = mock.Mock()
    admin.image.get_image.return_value.properties = properties
    return admin


def test_a_guest_is_ready_at_its_images_ready_line_or_the_benchmarks(monkeypatch):
    conn = mock.MagicMock()
    conn.compute.get_server.return_value.status = 'ACTIVE'
    consoles = iter(['booting\n', 'booting\nmy image is up\n'])
    conn.compute.get_server_console_output.side_effect = lambda server_id: {
        'output': next(consoles)}
    monkeypatch.setattr(cloud, 'cache_mode', lambda admin, server_id: 'none')

    def wait(what, timeout, done, *args, **kwargs):
        for _ in range(2):
            if done():
                return True
        raise AssertionError('never %s' % what)
    monkeypatch.setattr(cloud, 'wait', wait)
    # The image's own pattern (the Glance worker's property), not the test image's marker.
    image = mock.Mock(id='image-a')
    cloud.boot_servers(conn, admin_of({'yolo_ready_pattern': 'image is up$'}), image,
                       mock.Mock(id='f'), 'b', 1, timeout=600)
    assert not cloud.READY_PATTERN.search('booting\nmy image is up\n')
    assert cloud.ready_pattern(admin_of({}), 'image-a') is cloud.READY_PATTERN
    assert cloud.READY_PATTERN.search('vm login: ') and cloud.READY_PATTERN.search(
        'YOLO-GUEST-READY')
    # The benchmark's --ready-pattern wins.
    try:
        cloud.set_ready_pattern(re.compile('ready!'))
        assert cloud.ready_pattern(admin_of({'yolo_ready_pattern': 'x'}), 'i').pattern == \
            'ready!'
    finally:
        cloud.set_ready_pattern(None)


def test_a_guest_that_panics_fails_its_boot_at_once_and_is_deleted(monkeypatch):
    conn = mock.MagicMock()
    server = conn.compute.create_server.return_value
    conn.compute.get_server.return_value.status = 'ACTIVE'
    conn.compute.get_server_console_output.return_value = {'output': (
        'run-init: nuking initramfs contents: No such file or directory\n'
        '[   17.5] Kernel panic - not syncing: Attempted to kill init!\n[   17.6] Call Trace:\n')}
    monkeypatch.setattr(cloud, 'cache_mode', lambda admin, server_id: 'none')
    with pytest.raises(cloud.GuestFailed, match='panicked: Kernel panic - not syncing: '
                                                'Attempted to kill init!$'):
        cloud.boot_servers(conn, admin_of({}), mock.Mock(), mock.Mock(), 'b', 1, timeout=600)
    conn.compute.delete_server.assert_called_once_with(server.id)


def test_distinct_images_are_a_condition_of_their_own():
    measured = (boots('on', 0, 1, [40, 41, 39]) + boots('on', 0, 4, [90, 95, 100])
                + [Boot('on', 0, 4, rep, s - 10, s, 'none', 'distinct')
                   for rep, s in enumerate([120, 110, 130], 1)])
    lines = cloud.summary(measured).splitlines()
    assert lines[3].startswith('| 0 | 4 | none | 95.0 (90.0-100.0)')
    assert lines[4].startswith('| 0 | 4 (distinct images) | none | 120.0 (110.0-130.0)')
    assert lines[-2:] == ['YOLO on with 0 stressors, 4 servers / YOLO on idle: 2.38',
                          'YOLO on with 0 stressors, 4 servers of distinct images / YOLO on '
                          'idle: 3.00']
    assert cloud.parse_args(['--images', 'same,distinct']).images == ['same', 'distinct']


def test_distinct_images_are_a_server_each(monkeypatch):
    conn = mock.MagicMock()
    conn.compute.get_server.return_value.status = 'ACTIVE'
    conn.compute.get_server_console_output.return_value = {'output': 'YOLO-GUEST-READY\n'}
    monkeypatch.setattr(cloud, 'cache_mode', lambda admin, server_id: 'none')
    images = [mock.Mock(id='image-a'), mock.Mock(id='image-b')]
    cloud.boot_servers(conn, admin_of({}), images, mock.Mock(id='f'), 'b', 2, timeout=600)
    created = conn.compute.create_server.call_args_list
    assert [(c.kwargs['name'], c.kwargs['image_id']) for c in created] == [
        ('b-1', 'image-a'), ('b-2', 'image-b')]
    assert conn.compute.delete_server.call_count == 2


def test_the_guests_disk_time_is_summarised_where_it_was_measured():
    measured = [dataclasses.replace(boot, disk_seconds=(float(rep), 2.0 * rep, 0.5))
                for rep, boot in enumerate(boots('on', 8, 1, [50, 52, 49]) +
                                           boots('off', 8, 1, [300, 330, 320]))]
    lines = cloud.summary(measured).splitlines()
    assert lines[-2:] == [
        "Guests' root disk requests up to ready, median of their summed latency (reads / "
        "writes / flushes, s):",
        '- 8 stressors, 1 server: off 4.0 / 8.0 / 0.5, on 1.0 / 2.0 / 0.5']


def test_boots_round_trip_through_the_csv_file_and_report_from_it(tmp_path, capsys):
    measured = boots('off', 8, 1, [300, 330]) + boots('on', 8, 1, [50, 52])
    measured[0].disk_seconds = (92.8, 5.1, 0.9)
    path = tmp_path / 'cloud.csv'
    for boot in measured:
        cloud.append_csv(path, boot)
    assert path.read_text().splitlines()[0] == (
        'policy,stressors,servers,images,repetition,active_s,ready_s,cache,disk_read_s,'
        'disk_write_s,disk_flush_s')
    assert cloud.read_csv(path) == measured
    assert cloud.main(['--report', str(path), str(path)]) == 0
    assert '| 8 | 1 | none | 315.0 (300.0-330.0), 305.0 | 51.0 (50.0-52.0), 41.0 | 6.18 |' in \
        capsys.readouterr().out


def test_a_foreign_csv_file_is_refused(tmp_path):
    path = tmp_path / 'boot.csv'
    path.write_text('storage,scenario,size\nhdd,contention,8\n')
    with pytest.raises(ValueError, match='expected columns policy, stressors'):
        cloud.read_csv(path)


def test_the_plot_is_written(tmp_path):
    measured = (boots('off', 0, 1, [40, 44, 42]) + boots('on', 0, 1, [40, 41, 39]) +
                boots('off', 8, 1, [300, 330, 320]) + boots('on', 8, 1, [50, 52, 49]))
    path = cloud.plot(measured, tmp_path / 'nova.png')
    assert path.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


def test_another_compute_host_is_disabled_while_the_benchmark_runs_and_enabled_after():
    admin, service = mock.Mock(), mock.Mock(host='aio-compute-2')
    with pytest.raises(RuntimeError):
        with cloud.disabled(admin, service):
            admin.compute.disable_service.assert_called_once()
            assert admin.compute.disable_service.call_args.args == (service,)
            admin.compute.enable_service.assert_not_called()
            raise RuntimeError('a boot failed')
    admin.compute.enable_service.assert_called_once_with(service)
