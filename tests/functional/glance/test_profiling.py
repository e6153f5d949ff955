"""The profiling boot's plugins: the defaults boot as before, an operator's plugin installed by
entry point is used, unknown names and plugins that ask too much are refused.

The profiling boot itself is replaced by a fixed trace (test_worker.py's fake learner); QEMU's
command line is built, never run.
"""

import sys

from oslo_config import cfg
import pytest
import stevedore

from tests.functional.glance.fakes import fake_learner
from tests.functional.glance.fakes import raw_disk
from yolo_common import qemu
from yolo_common import yolofs
from yolo_glance import conf as yolo_conf
from yolo_glance import glance as glance_api
from yolo_glance import profiling
from yolo_glance import service
from yolo_glance import worker as worker_mod

# Today's profiling boot, as QEMU gets it: TCG, no network device, the seccomp sandbox, no
# default device but the VGA (all of it inside the worker's sandbox: test_sandbox.py).
TODAYS_COMMAND = [
    qemu.QEMU, '-accel', 'tcg', '-m', '1024', '-smp', '1', '-display', 'none',
    '-monitor', 'none', '-serial', 'stdio', '-no-reboot',
    '-drive', 'file=learn.qcow2,format=qcow2,if=virtio,cache=none', '-nic', 'none',
    '-sandbox', 'on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny',
    '-nodefaults', '-vga', 'std']


def worker_conf(tmp_path, config=None, **profiling_options):
    conf = cfg.ConfigOpts()
    yolo_conf.register_opts(conf)
    args = []
    if config:
        (tmp_path / 'worker.conf').write_text(config)
        args = ['--config-file', str(tmp_path / 'worker.conf')]
    conf(args, project='yolo-test', default_config_files=[])
    conf.set_override('work_dir', str(tmp_path / 'work'), group='yolo_worker')
    conf.set_override('yolofs_binary', yolofs.binary(), group='yolo_worker')
    conf.set_override('retries', 0, group='yolo_worker')
    for name, value in profiling_options.items():
        conf.set_override(name, value, group='yolo_profiling')
    return conf


def boot_command(learner_call):
    """The QEMU command line the learner would boot with (learning.learn_boot_image passes
    everything but the window to qemu.Guest)."""
    options = {k: v for k, v in learner_call.items()
               if k not in ('boot_timeout', 'idle_seconds', 'sandbox', 'yolofs_binary')}
    return qemu.Guest('learn.qcow2', **options).command


def build_with(dispatcher, glance, **fields):
    dispatcher.worker.learner = fake_learner()
    source = glance.add(raw_disk(), **fields)
    outcome = dispatcher.build(source).result(60)
    dispatcher.shutdown()
    return outcome, source, dispatcher.worker.learner.calls


# -- the defaults ---------------------------------------------------------------------------

def test_the_defaults_are_installed_entry_points():
    assert isinstance(profiling.load_runner('tcg'), profiling.TcgRunner)
    assert isinstance(profiling.load_runner('kvm'), profiling.KvmRunner)
    assert [type(d) for d in profiling.load_readiness(['console', 'idle'])] == [
        profiling.ConsoleReadiness, profiling.IdleReadiness]


def test_the_default_configuration_boots_as_before(glance, tmp_path):
    conf = worker_conf(tmp_path)
    assert (conf.yolo_profiling.runner, conf.yolo_profiling.readiness) == ('tcg',
                                                                           ['console', 'idle'])
    outcome, _, calls = build_with(service.make_dispatcher(conf, glance), glance)
    assert outcome == 'ready'
    call = calls[0]
    assert boot_command(call) == TODAYS_COMMAND
    assert call['network'] is False
    assert call['ready_marker'].pattern == conf.yolo_profiling.ready_pattern.encode()
    assert (call['idle_seconds'], call['boot_timeout']) == (30.0, 600.0)


def test_a_worker_built_without_plugins_boots_as_before(glance, make_worker):
    worker = make_worker()
    assert worker.build(glance.add(raw_disk())) == 'ready'
    assert boot_command(worker.learner.calls[0]) == TODAYS_COMMAND


def test_the_old_accel_option_still_selects_the_runner(tmp_path):
    conf = worker_conf(tmp_path, '[yolo_profiling]\naccel = kvm\n')
    assert conf.yolo_profiling.runner == 'kvm'


def test_kvm_runner_boots_with_kvm_and_keeps_the_sandbox(glance, make_worker):
    worker = make_worker(runner=profiling.KvmRunner())
    worker.build(glance.add(raw_disk()))
    command = boot_command(worker.learner.calls[0])
    assert command == [a if a != 'tcg' else 'kvm' for a in TODAYS_COMMAND]


def test_kvm_runner_needs_dev_kvm(monkeypatch, tmp_path, make_worker):
    monkeypatch.setattr(profiling, 'KVM_DEVICE', str(tmp_path / 'kvm'))
    with pytest.raises(profiling.PluginError, match='kvm: .*/kvm is missing'):
        make_worker(runner=profiling.KvmRunner()).check()
    (tmp_path / 'kvm').touch()
    make_worker(runner=profiling.KvmRunner()).check()


def test_console_only_waits_for_the_pattern(glance, make_worker):
    worker = make_worker(readiness=[profiling.ConsoleReadiness()])
    worker.build(glance.add(raw_disk()))
    call = worker.learner.calls[0]
    assert call['idle_seconds'] is None and call['ready_marker'].pattern == b'login:'


def test_idle_only_never_matches_the_console(glance, make_worker):
    worker = make_worker(readiness=[profiling.IdleReadiness()])
    worker.build(glance.add(raw_disk(), **{worker_mod.READY_PATTERN_PROPERTY: 'x'}))
    call = worker.learner.calls[0]
    assert call['idle_seconds'] == 30.0
    assert call['ready_marker'].search(b'login: x YOLO-GUEST-READY') is None


# -- an operator's plugins ------------------------------------------------------------------

OPERATOR_MODULE = '''
import re2

from yolo_glance import profiling


class HostCpuRunner(profiling.Runner):
    def qemu_options(self, options):
        return {'accel': 'kvm', 'extra_args': ('-cpu', 'host', '-smp', '2')}


class SystemdReadiness(profiling.Readiness):
    def console_matcher(self, options):
        return re2.compile(rb'Reached target .*Multi-User System')
'''
OPERATOR_ENTRY_POINTS = '''
[yolo.profiling.runners]
host-cpu = yolo_operator_plugins:HostCpuRunner
misspelt = yolo_operator_plugins:HostCPURunner

[yolo.profiling.readiness]
systemd = yolo_operator_plugins:SystemdReadiness
'''


@pytest.fixture
def operator_plugins(tmp_path, monkeypatch):
    """An operator's package installed beside YOLO, declaring its plugins by entry point."""
    site = tmp_path / 'site-packages'
    dist_info = site / 'yolo_operator_plugins-1.0.dist-info'
    dist_info.mkdir(parents=True)
    (dist_info / 'METADATA').write_text(
        'Metadata-Version: 2.1\nName: yolo-operator-plugins\nVersion: 1.0\n')
    (dist_info / 'entry_points.txt').write_text(OPERATOR_ENTRY_POINTS)
    (site / 'yolo_operator_plugins.py').write_text(OPERATOR_MODULE)
    monkeypatch.syspath_prepend(str(site))
    # stevedore keeps the entry points it found per group: forget them for this test only, and
    # keep the scan of this temporary path out of stevedore's cache directory.
    monkeypatch.setattr(stevedore.ExtensionManager, 'ENTRY_POINT_CACHE', {})
    monkeypatch.setattr(stevedore._cache._c, '_disable_caching', True)
    monkeypatch.delitem(sys.modules, 'yolo_operator_plugins', raising=False)
    return site


def test_an_operators_plugins_are_used(operator_plugins, glance, tmp_path):
    conf = worker_conf(tmp_path, runner='host-cpu', readiness=['systemd', 'console', 'idle'])
    dispatcher = service.make_dispatcher(conf, glance)
    assert type(dispatcher.worker.runner).__name__ == 'HostCpuRunner'
    outcome, source, calls = build_with(dispatcher, glance)
    assert outcome == 'ready' and glance.images[source][glance_api.STATUS] == 'ready'
    call = calls[0]
    # The runner's choices, and still no network device and the sandbox.
    assert boot_command(call) == [a if a != 'tcg' else 'kvm' for a in TODAYS_COMMAND] + [
        '-cpu', 'host', '-smp', '2']
    # Either detector's console output ends the window; the idle gap still applies.
    marker = call['ready_marker']
    assert marker.search(b'[  OK  ] Reached target Multi-User System.') is not None
    assert marker.search(b'debian login:') is not None
    assert marker.search(b'Started Journal Service') is None
    assert call['idle_seconds'] == 30.0


def test_a_plugin_that_does_not_load_fails_at_start(operator_plugins, glance, tmp_path):
    with pytest.raises(profiling.PluginError,
                       match=r"cannot load yolo.profiling.runners plugin 'misspelt' "
                             r"\(yolo_operator_plugins:HostCPURunner\): .*HostCPURunner"):
        service.make_dispatcher(worker_conf(tmp_path, runner='misspelt'), glance)


def test_an_unknown_runner_fails_at_start(glance, tmp_path):
    with pytest.raises(profiling.PluginError,
                       match=r"no profiling runner 'qemu-fast' in yolo.profiling.runners "
                             r"\(installed: .*kvm, tcg"):
        service.make_dispatcher(worker_conf(tmp_path, runner='qemu-fast'), glance)


def test_an_unknown_readiness_detector_fails_at_start(glance, tmp_path):
    with pytest.raises(profiling.PluginError,
                       match=r"no readiness detector 'ssh-banner' in yolo.profiling.readiness "
                             r"\(installed: .*console, idle"):
        service.make_dispatcher(worker_conf(tmp_path, readiness=['console', 'ssh-banner']),
                                glance)
    with pytest.raises(profiling.PluginError, match='names no readiness detector'):
        service.make_dispatcher(worker_conf(tmp_path, readiness=[]), glance)


def test_a_bad_ready_pattern_fails_at_start(glance, tmp_path):
    with pytest.raises(profiling.PluginError, match=r'\[yolo_profiling\]: bad ready pattern'):
        service.make_dispatcher(worker_conf(tmp_path, ready_pattern='('), glance)


def test_the_worker_exits_with_the_reason(tmp_path, monkeypatch, caplog):
    (tmp_path / 'worker.conf').write_text('[yolo_profiling]\nrunner = qemu-fast\n')
    monkeypatch.setattr(glance_api.Glance, 'from_conf', classmethod(lambda cls, conf: None))
    monkeypatch.setattr(service.oslo_logging, 'setup', lambda *args: None)
    with pytest.raises(SystemExit) as exit_:
        service.main(['--config-file', str(tmp_path / 'worker.conf')])
    assert exit_.value.code == 1
    assert "no profiling runner 'qemu-fast'" in caplog.text


# -- what a runner may not do ---------------------------------------------------------------

class GreedyRunner(profiling.Runner):
    def __init__(self, **wanted):
        self.wanted = wanted

    def qemu_options(self, options):
        return self.wanted


@pytest.mark.parametrize('wanted, error', [
    ({'accel': 'tcg', 'extra_args': ('-nic', 'user,model=virtio-net-pci')}, 'QEMU options -nic'),
    ({'accel': 'tcg', 'extra_args': ('-sandbox', 'off')}, 'QEMU options -sandbox'),
    ({'accel': 'tcg', 'extra_args': ('-cpu',)}, 'each with its value'),
    ({'accel': 'tcg', 'network': True}, 'unknown boot options network'),
    ({'accel': 'tcg', 'memory_mib': 65536}, 'unknown boot options memory_mib'),
    ({'accel': 'xen'}, "accelerator 'xen'"),
    ({}, 'accelerator None'),
])
def test_a_runner_cannot_drop_the_workers_limits(glance, make_worker, wanted, error):
    worker = make_worker(runner=GreedyRunner(**wanted))
    with pytest.raises(profiling.PluginError, match=error):
        worker.check()
    # Had it passed the start, its builds fail with the reason, and nothing boots.
    source = glance.add(raw_disk())
    assert worker.build(source) == 'failed'
    assert 'profiling runner GreedyRunner' in glance.images[source][glance_api.REASON]
    assert worker.learner.calls == []


def test_readiness_cannot_stretch_the_window(glance, make_worker):
    class Lazy(profiling.Readiness):
        def idle_seconds(self, options):
            return 1e9

    class Eager(profiling.Readiness):
        def idle_seconds(self, options):
            return 0

    worker = make_worker(readiness=[Lazy()])
    worker.build(glance.add(raw_disk(), **{worker_mod.MAX_PROPERTY: '120'}))
    assert (worker.learner.calls[0]['idle_seconds'],
            worker.learner.calls[0]['boot_timeout']) == (120.0, 120.0)
    worker = make_worker(readiness=[Eager()])
    worker.build(glance.add(raw_disk()))
    assert worker.learner.calls[0]['idle_seconds'] == worker_mod.MIN_IDLE_SECONDS
