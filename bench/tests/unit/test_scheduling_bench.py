"""The scheduling benchmark reads YoloBootFilter's predictions from the scheduler's log: here, from
lines the filter itself logged, as oslo.log writes them at debug level."""

import contextlib
import os
import types

import fixtures
import psutil

from yolo_bench import scheduling
from yolo_nova.model import estimators
from yolo_nova.scheduler.filters import boot_time_filter
from yolo_testing import aio

from tests.unit.nova_base import NoDBTestCase
from tests.unit.scheduler.test_boot_time import host
from tests.unit.scheduler.test_boot_time import spec
from tests.unit.scheduler.test_boot_time import stats


class TestPredictionsFromTheLog(NoDBTestCase):

    def test_each_hosts_last_prediction_and_verdict(self):
        self.flags(max_boot_time_ratio=2.0, group='yolo')
        hosts = [host('aio-compute', dict(stats(io=0.97), yolo_cpu_pressure='0.3')),
                 host('aio-compute-2', stats(io=0.02))]
        logger = boot_time_filter.LOG.logger
        with self.assertLogs(logger, 'DEBUG') as logs:
            boot_time_filter.YoloBootFilter().filter_all(hosts, spec())
        log = self.useFixture(fixtures.TempDir()).join('nova-scheduler.log')
        with open(log, 'w') as f:
            f.write('2026-11-24 21:00:00.000 1 DEBUG nova.scheduler [req-x] earlier line\n')
            since = f.tell()
            for record in logs.records:
                # oslo.log's debug suffix follows the message.
                f.write('2026-11-24 21:00:01.000 1 DEBUG %s [req-y] %s {{(pid=1) _passes '
                        'boot_time_filter.py:51}}\n' % (record.name, record.getMessage()))
        found = aio.predictions(since, log)
        self.assertEqual({'aio-compute', 'aio-compute-2'}, set(found))
        busy, idle = found['aio-compute'], found['aio-compute-2']
        self.assertEqual((0.97, 'rejected', 0.3), busy[1:4])
        self.assertEqual((0.02, 'passes', None), idle[1:4])
        self.assertGreater(busy[0], 2 * idle[0])
        # Hosts from before locality reports: the image cached, nothing fetched.
        self.assertEqual(('cached', 0.0), busy[5:])
        self.assertAlmostEqual(busy[0], busy[4], places=1)


def test_the_summary_counts_placements_and_the_models_error():
    requests = [
        scheduling.Request('on', 'aio-compute', 1, 'aio-compute-2',
                           {'aio-compute': (90.0, 0.97, 'rejected', 0.25),
                            'aio-compute-2': (30.0, 0.01, 'passes', None)}, 25.0),
        scheduling.Request('off', 'aio-compute', 1, 'aio-compute',
                           {'aio-compute': (90.0, 0.97, 'passes', 0.25),
                            'aio-compute-2': (30.0, 0.01, 'passes', 0.0)}, 100.0),
    ]
    assert requests[0].error == (30.0 - 25.0) / 25.0
    lines = scheduling.summary(requests).splitlines()
    assert lines[2] == ('| on | aio-compute | 1 | 90.0 (0.97, 0.25), rejected | 30.0 (0.01, -) | '
                        'aio-compute-2 | 25.0 | +20% |')
    assert lines[3] == ('| off | aio-compute | 1 | 90.0 (0.97, 0.25) | 30.0 (0.01, 0.00) | '
                        'aio-compute | 100.0 | -10% |')
    assert lines[-2] == ('YOLO on: 1 of 1 servers on the host without contention; mean absolute '
                         'model error 20%; boot median 25.0 s')
    assert lines[-1].startswith('YOLO off: 0 of 1 servers on the host without contention')


def test_a_request_without_a_prediction_for_its_host_has_no_error():
    request = scheduling.Request('on', 'a', 1, 'b', {}, 20.0)
    assert request.error is None


def test_each_request_is_predicted_from_reports_taken_after_the_server_before_it_was_gone(
        monkeypatch, capsys, tmp_path):
    clock = iter(range(1000, 100000, 100))     # each request reads it when asked and done
    events = []

    @contextlib.contextmanager
    def contention(host, stressors):
        events.append(('contention', host, stressors))
        yield 'settled on %s' % host

    def request(conn, admin, image, flavor, name, timeout, **placement):
        events.append(('request', name, placement))
        return placement.get('host', 'aio-compute-2'), 30.0, {}

    monkeypatch.setattr(scheduling.cloud, 'public_image', lambda admin, name: name)
    monkeypatch.setattr(scheduling.cloud, 'wait_for_boot_image', lambda *args: None)
    monkeypatch.setattr(scheduling, 'set_scheduler', lambda setting: events.append(setting))
    monkeypatch.setattr(scheduling.aio, 'contention', contention)
    monkeypatch.setattr(scheduling.aio, 'wait_for_reports',
                        lambda hosts, after: events.append(('reports', after)) or {})
    monkeypatch.setattr(scheduling, 'reported_parameters', lambda hosts: {})
    monkeypatch.setattr(scheduling, 'request', request)
    monkeypatch.setattr(scheduling.aio, 'GUESTS_CGROUP_FILES', {
        'aio-compute': tmp_path / 'absent', 'aio-compute-2': tmp_path / 'absent'})
    monkeypatch.setattr(scheduling, 'device_of', lambda path: '/dev/loop9')
    monkeypatch.setattr(scheduling.time, 'time', lambda: next(clock))
    monkeypatch.setattr(scheduling.cloud, 'boot_servers', None)  # no warm-ups
    timed = observed(seconds=41.0, cpu_seconds=30.0, cpu_delay_seconds=2.5, disk_seconds=0.75,
                     disk_write_seconds=0.25, accel='tcg')
    monkeypatch.setattr(scheduling.aio, 'observed_boots',
                        lambda host, since=0.0: [timed] if host == 'aio-compute-2' else [])
    times = iter([cpu(busy=100.0, steal=0.0), cpu(busy=150.0, steal=10.0)] * 6)
    monkeypatch.setattr(scheduling.psutil, 'cpu_times', lambda: next(times))
    flavors = types.SimpleNamespace(find_flavor=lambda name: name)
    monkeypatch.setattr(scheduling.openstack, 'connect',
                        lambda cloud: types.SimpleNamespace(compute=flavors))
    assert scheduling.main(['--requests', '2', '--on-contended', '1', '--warm-ups', '0',
                            '--yolo', 'on']) == 0
    settle = scheduling.aio.LOAD_SETTLE_SECONDS
    assert events == [
        'on',
        ('contention', 'aio-compute', 2), ('reports', 'settled on aio-compute'),
        ('reports', 'settled on aio-compute'), ('request', 'scheduling-on-aio-compute-1', {}),
        ('reports', 1100 + settle), ('request', 'scheduling-on-aio-compute-2', {}),
        ('reports', 1300 + settle),
        ('request', 'scheduling-on-aio-compute-3', {'host': 'aio-compute'}),
        ('contention', 'aio-compute-2', 2), ('reports', 'settled on aio-compute-2'),
        ('reports', 'settled on aio-compute-2'), ('request', 'scheduling-on-aio-compute-2-1', {}),
        ('reports', 1700 + settle), ('request', 'scheduling-on-aio-compute-2-2', {}),
        ('reports', 1900 + settle),
        ('request', 'scheduling-on-aio-compute-2-3', {'host': 'aio-compute-2'}),
        'on']
    out = capsys.readouterr().out
    # Every server landed on aio-compute-2, contended in the second phase; the servers asked
    # onto the contended host by name are not counted there.
    assert '2 of 4 servers on the host without contention' in out
    assert 'YOLO on, servers asked onto the contended host: mean absolute model error -; ' \
        'boot median 30.0 s' in out
    # Where each guest's boot went, as its host timed it, and what the hypervisor took.
    assert out.count('    its guest: 41.0 s from its start to ready: vCPU 30.0 s, waited for a '
                     'CPU 2.5 s, for its reads 0.50 s, its writes 0.25 s; steal 20% of the '
                     'CPUs\' busy time meanwhile\n') == 5   # not the one on aio-compute
    # Then the model on each host's own boots, as it learned (too few here to replay).
    for name in ('aio-compute', 'aio-compute-2'):
        assert '==> the model on the boots %s timed, each predicted from those before it' % name \
            in out
    assert out.count('no boot to replay: fewer than 3 served from a boot image before any') == 2


def observed(**fields):
    return estimators.ObservedBoot(**dict(
        dict(started_at=1100.0, boot_image=True, io_utilisation=0.0, cpu_utilisation=0.0),
        **fields))


def cpu(busy, steal, idle=1000.0):
    """psutil.cpu_times() of a machine whose CPUs were busy for ``busy`` seconds, ``steal`` of
    them taken by its hypervisor."""
    return psutil.cpu_times()._replace(
        user=busy - steal, nice=0.0, system=0.0, idle=idle, iowait=5.0, irq=0.0, softirq=0.0,
        steal=steal, guest=0.0, guest_nice=0.0)


def test_the_steal_is_a_share_of_the_busy_time():
    assert scheduling.stolen_share(cpu(100.0, 0.0), cpu(300.0, 50.0, idle=1200.0)) == 0.25
    assert scheduling.stolen_share(cpu(100.0, 0.0), cpu(100.0, 0.0)) == 0.0


def test_a_boot_is_described_with_what_its_host_knew_of_it():
    boot = observed(seconds=33.0, cpu_seconds=32.0, disk_seconds=0.5)
    assert scheduling.described(boot) == ('33.0 s from its start to ready: vCPU 32.0 s, for its '
                                          'disks 0.50 s')
    assert scheduling.described(None) == 'not timed'


def test_a_hosts_stressors_join_the_throttle_its_libvirt_hook_names(tmp_path, monkeypatch):
    cgroup = tmp_path / 'yolo-aio-aio-compute'
    cgroup.mkdir()
    named = tmp_path / 'yolo-guests-blkio-cgroup'
    named.write_text('%s\n' % cgroup)
    monkeypatch.setitem(scheduling.aio.GUESTS_CGROUP_FILES, 'aio-compute', named)
    monkeypatch.setitem(scheduling.aio.GUESTS_CGROUP_FILES, 'aio-compute-2', tmp_path / 'absent')
    throttled = scheduling.aio.instance_storage('aio-compute')
    assert throttled.root == scheduling.INSTANCES['aio-compute'] and throttled.name == 'hdd'
    throttled.join_cgroup()
    assert (cgroup / 'cgroup.procs').read_text() == str(os.getpid())
    unthrottled = scheduling.aio.instance_storage('aio-compute-2')
    assert unthrottled.name == 'local' and not hasattr(unthrottled, 'cgroup')
    # A file a killed benchmark left, naming its cgroup, now gone.
    cgroup.joinpath('cgroup.procs').unlink()
    cgroup.rmdir()
    assert scheduling.aio.instance_storage('aio-compute').name == 'local'


def test_setting_the_scheduler_writes_its_yolo_options_and_restarts_it(tmp_path, monkeypatch):
    conf = tmp_path / 'nova-scheduler.conf'
    conf.write_text('[yolo]\nmax_boot_time_ratio = 1.5\n')
    monkeypatch.setattr(scheduling, 'SCHEDULER_CONF', conf)
    ran = []
    monkeypatch.setattr(scheduling.subprocess, 'run', lambda args, **kw: ran.append(args))
    scheduling.set_scheduler('off')
    assert 'boot_time_weight_multiplier = 0' in conf.read_text()
    scheduling.set_scheduler('on')
    assert 'boot_time_weight_multiplier' not in conf.read_text()
    assert ran == [[str(aio.AIO), 'restart-scheduler']] * 2
