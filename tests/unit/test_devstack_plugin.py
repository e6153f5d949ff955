"""The devstack plugin, phase by phase, on compute, controller and all-in-one nodes.

devstack itself needs systemd, root and a network, so the plugin runs here against a stand-in
(devstack_standin/functions.sh) of the devstack functions it calls, with fake commands (sudo,
cargo, curl, yolo-configure, ...) on PATH; both record every call, and the tests read them back.
"""

import grp
import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
STANDIN = pathlib.Path(__file__).resolve().parent / 'devstack_standin'
STACK = ('pre-install', 'install', 'post-config', 'extra')
FAKES = ('sudo', 'cargo', 'curl', 'findmnt', 'yolo-configure', 'yolo-glance-worker')

COMPUTE = 'n-cpu,q-agt,placement-client'
CONTROLLER = 'key,mysql,rabbit,g-api,n-api,n-cond,n-sch,placement-api,q-svc'
ALL_IN_ONE = CONTROLLER + ',' + COMPUTE


class Devstack:
    """One devstack node: its services, local.conf variables and host cargo (None: none)."""

    def __init__(self, tmp_path, services, cargo='1.91.0', localrc='', **variables):
        self.root = tmp_path
        self.bin = tmp_path / 'bin'
        self.bin.mkdir(parents=True)
        for name in FAKES:
            (self.bin / name).symlink_to(STANDIN / 'fake')
        self.dest = tmp_path / 'opt' / 'stack'
        self.checkout = self.dest / 'yolo'
        (self.checkout / 'yolofs').mkdir(parents=True)
        self.log = tmp_path / 'calls'
        self.localrc = localrc
        self.env = {
            'PATH': '%s:/usr/bin:/bin' % self.bin,
            'HOME': str(tmp_path),
            'STANDIN_ROOT': str(tmp_path),
            'STANDIN_LOG': str(self.log),
            'ENABLED_SERVICES': services,
            # devstack's venv: pip_install puts yolo-configure in its bin, here the fakes.
            'DEVSTACK_VENV': str(tmp_path),
            'FAKE_CARGO_VERSION': cargo or '',
            **variables,
        }

    def run(self, *invocations, xtrace=False):
        """Sources settings, then plugin.sh once per invocation (("stack", "install"), ...), in
        one shell as stack.sh does; returns the calls recorded, as tuples."""
        lines = ['set -o errexit -o nounset',
                 'source %s/functions.sh' % STANDIN,
                 self.localrc,
                 'source %s/devstack/settings' % REPO]
        if xtrace:
            lines.append('set -o xtrace')
        lines += ['source %s/devstack/plugin.sh %s' % (REPO, ' '.join(args))
                  for args in invocations]
        lines.append('if [[ -o xtrace ]]; then echo xtrace-on; else echo xtrace-off; fi')
        self.log.write_text('')
        result = subprocess.run(['bash', '-c', '\n'.join(lines)], env=self.env, text=True,
                                capture_output=True, cwd=self.root, timeout=60)
        assert result.returncode == 0, result.stderr
        self.stdout, self.stderr = result.stdout, result.stderr
        return [tuple(line.split('\t')) for line in self.log.read_text().splitlines()]

    def stack(self, *phases):
        return self.run(*[('stack', phase) for phase in phases or STACK])


def named(calls, name):
    return [call[1:] for call in calls if call[0] == name]


def roles(calls):
    return [args[0] for args in named(calls, 'yolo-configure')]


def option(args, name):
    return args[args.index(name) + 1]


def started(calls):
    return [args[0] for args in named(calls, 'started')]


def test_settings_define_the_plugin_and_enable_its_services(tmp_path):
    calls = Devstack(tmp_path, COMPUTE).run()
    assert ('define_plugin', 'yolo') in calls
    assert ('enable_service', 'yolofs', 'yolo-glance-worker') in calls


def test_a_compute_node_runs_yolofs_and_the_driver_only(tmp_path):
    node = Devstack(tmp_path, COMPUTE)
    calls = node.stack()
    assert named(calls, 'install_package') == [('fuse3', 'qemu-utils')]
    assert roles(calls) == ['nova-compute']
    compute = named(calls, 'yolo-configure')[0]
    assert option(compute, '--config-file') == '/etc/nova/nova.conf'
    assert option(compute, '--mount-point') == str(node.dest / 'data/nova/yolofs')
    assert option(compute, '--control-socket') == '/run/yolofs/control.sock'
    assert started(calls) == ['yolofs']
    assert not named(calls, 'get_or_create_user')
    # The binary is built and installed; the package installed from the checkout, not editable.
    assert ('install', '-m', '0755', str(node.checkout / 'yolofs/target/release/yolofs'),
            '/usr/local/bin/yolofs') in named(calls, 'sudo')
    assert named(calls, 'pip_install') == [(str(node.checkout) + '[re2]',)]


def test_yolofs_runs_as_root_with_the_socket_for_nova_computes_group(tmp_path):
    node = Devstack(tmp_path, COMPUTE)
    calls = node.stack('post-config')
    [(name, command, group, user)] = named(calls, 'run_process')
    assert (name, group, user) == ('yolofs', '', 'root')
    data = node.dest / 'data'
    assert command.split() == [
        # The keeper starts yolofs again on the same mount whenever it dies.
        '/usr/local/bin/yolofs', 'keep', '--',
        '/usr/local/bin/yolofs', 'mount', '--source', str(data / 'nova/instances/_base'),
        '--mountpoint', str(data / 'nova/yolofs'),
        '--boot-images', str(data / 'yolo/boot-images'),
        '--control-socket', '/run/yolofs/control.sock',
        # devstack runs nova-compute with group $LIBVIRT_GROUP.
        '--control-socket-group', 'libvirt', '--control-socket-mode', '0660',
        '--learn', '--mlock', '--pin-qemu', '--record-idle-secs', '30',
        '--metrics-address', '127.0.0.1:9466']
    # Started after nova.conf has the driver, and after a dead mount is detached.
    assert calls.index(('yolo-configure',) + named(calls, 'yolo-configure')[0]) < \
        calls.index(('sudo', 'fusermount3', '-uz', str(data / 'nova/yolofs'))) < \
        calls.index(('started', 'yolofs'))
    assert not started(node.stack('extra'))


def test_without_libvirt_the_socket_gets_the_stack_users_group(tmp_path):
    node = Devstack(tmp_path, COMPUTE, LIBVIRT_GROUP='', STACK_USER='root')
    [(_, command, _, _)] = named(node.stack('post-config'), 'run_process')
    assert '--control-socket-group %s ' % grp.getgrgid(0).gr_name in command


def test_a_controller_runs_the_scheduler_api_and_glance_parts_and_the_worker(tmp_path):
    node = Devstack(tmp_path, CONTROLLER)
    calls = node.stack()
    assert roles(calls) == ['glance-api', 'worker', 'nova-scheduler', 'nova-api']
    assert 'yolofs' not in started(calls)
    # The worker's learning mounts and profiling boots need yolofs and QEMU here too.
    assert named(calls, 'install_package') == [
        ('fuse3', 'qemu-utils', 'qemu-system-x86', 'bubblewrap')]
    assert '/usr/local/bin/yolofs' in [args[-1] for args in named(calls, 'sudo')]
    glance = named(calls, 'yolo-configure')[0]
    assert option(glance, '--config-file') == '/etc/glance/glance-api.conf'
    assert option(glance, '--import-config-file') == '/etc/glance/glance-image-import.conf'
    assert option(glance, '--property-protection-file') == \
        '/etc/glance/property-protections.conf'


def test_the_worker_starts_in_extra_as_the_stack_user(tmp_path):
    node = Devstack(tmp_path, CONTROLLER)
    assert not started(node.stack('pre-install', 'install', 'post-config'))
    calls = node.stack('extra')
    assert started(calls) == ['yolo-glance-worker']
    # No group or user: run_process runs it as the stack user.
    assert named(calls, 'run_process') == [(
        'yolo-glance-worker',
        '%s/yolo-glance-worker --config-file /etc/yolo/yolo-glance-worker.conf' % node.bin)]


def test_the_worker_has_a_keystone_user_of_its_own(tmp_path):
    node = Devstack(tmp_path, CONTROLLER)
    calls = node.stack('post-config')
    assert named(calls, 'get_or_create_user') == [('yolo', 'service-secret', 'default')]
    assert named(calls, 'get_or_add_user_project_role') == [
        ('admin', 'id-of-yolo', 'service'), ('service', 'id-of-yolo', 'service')]
    worker = named(calls, 'yolo-configure')[1]
    assert (option(worker, '--username'), option(worker, '--password'),
            option(worker, '--project-name')) == ('yolo', 'service-secret', 'service')
    assert option(worker, '--transport-url') == \
        'rabbit://stackrabbit:rabbit-secret@controller:5672/'
    assert option(worker, '--auth-url') == 'http://controller/identity'
    assert option(worker, '--yolofs-binary') == '/usr/local/bin/yolofs'
    assert option(worker, '--work-dir') == str(node.dest / 'data/yolo/worker')
    assert 'admin-secret' not in node.log.read_text()


def test_the_workers_password_and_user_can_be_set(tmp_path):
    node = Devstack(tmp_path, CONTROLLER, YOLO_SERVICE_PASSWORD='yolo-secret',
                    YOLO_SERVICE_USER='boot-images')
    calls = node.stack('post-config')
    assert named(calls, 'get_or_create_user') == [('boot-images', 'yolo-secret', 'default')]
    worker = named(calls, 'yolo-configure')[1]
    assert (option(worker, '--username'), option(worker, '--password')) == (
        'boot-images', 'yolo-secret')
    assert 'service-secret' not in node.log.read_text()


def test_an_all_in_one_node_runs_everything(tmp_path):
    calls = Devstack(tmp_path, ALL_IN_ONE).stack()
    # The worker first: its signing key's public key goes to the compute node.
    assert roles(calls) == ['glance-api', 'worker', 'nova-compute', 'nova-scheduler', 'nova-api']
    worker, compute = named(calls, 'yolo-configure')[1:3]
    assert option(worker, '--signing-key-file') == '/etc/yolo/boot-image-signing.key'
    assert started(calls) == ['yolofs', 'yolo-glance-worker']
    assert [args[0] for args in named(calls, 'echo_summary')] == [
        "Installing YOLO's system packages", 'Installing YOLO', 'Configuring YOLO',
        'Starting yolo-glance-worker']


def test_nova_conf_is_rewritten_only_once_devstacks_own_edit_of_it_is_done(tmp_path):
    calls = Devstack(tmp_path, ALL_IN_ONE).stack('post-config')
    names = [call[0] if call[0] != 'yolo-configure' else call[1] for call in calls]
    assert ('async_wait', 'configure_neutron_nova') in calls
    waited = names.index('async_wait')
    assert all(names.index(role) > waited
               for role in ('nova-compute', 'nova-scheduler', 'nova-api'))


def test_a_compute_node_gets_the_workers_public_key_where_it_is_given(tmp_path):
    public_key = tmp_path / 'controller-key.pub'
    public_key.write_text('the public key\n')
    calls = Devstack(tmp_path / 'a', COMPUTE,
                     YOLO_SIGNING_PUBLIC_KEY_FILE=str(public_key)).stack('post-config')
    compute = named(calls, 'yolo-configure')[0]
    assert option(compute, '--boot-image-signing-key-file') == str(public_key)
    node = Devstack(tmp_path / 'b', COMPUTE,
                    YOLO_SIGNING_PUBLIC_KEY_FILE=str(tmp_path / 'not-copied.pub'))
    calls = node.stack('post-config')
    assert '--boot-image-signing-key-file' not in named(calls, 'yolo-configure')[0]
    assert 'no first boot before a download here' in node.stderr


def test_a_disabled_service_is_left_out(tmp_path):
    calls = Devstack(tmp_path, ALL_IN_ONE, localrc='disable_service yolo-glance-worker').stack()
    assert roles(calls) == ['nova-compute', 'nova-scheduler', 'nova-api']
    assert started(calls) == ['yolofs']
    assert not named(calls, 'get_or_create_user')


def test_a_compute_node_without_yolofs_gets_nothing_of_it(tmp_path):
    calls = Devstack(tmp_path / 'a', COMPUTE, localrc='disable_service yolofs').stack()
    assert not roles(calls) and not started(calls) and not named(calls, 'install_package')
    assert not named(calls, 'cargo')
    nothing = Devstack(tmp_path / 'b', ALL_IN_ONE,
                       localrc='disable_service yolofs yolo-glance-worker').stack()
    assert not [call for call in nothing if call[0] not in ('define_plugin', 'enable_service')]


def test_the_scheduler_part_can_be_turned_off(tmp_path):
    calls = Devstack(tmp_path, CONTROLLER, YOLO_SCHEDULER='False').stack()
    assert 'nova-scheduler' not in roles(calls)


def test_paths_and_options_come_from_local_conf(tmp_path):
    node = Devstack(tmp_path, COMPUTE, YOLOFS_MOUNTPOINT='/srv/yolofs',
                    YOLOFS_OPTIONS='--threads 8', YOLOFS_SOCKET_GROUP='nova',
                    YOLOFS_BIN='/opt/bin/yolofs')
    calls = node.stack('post-config')
    assert option(named(calls, 'yolo-configure')[0], '--mount-point') == '/srv/yolofs'
    command = named(calls, 'run_process')[0][1].split()
    assert command[0] == '/opt/bin/yolofs'
    assert option(command, '--mountpoint') == '/srv/yolofs'
    assert option(command, '--control-socket-group') == 'nova'
    assert command[-2:] == ['--threads', '8']


def test_other_distributions_get_their_package_names(tmp_path):
    calls = Devstack(tmp_path, CONTROLLER, STANDIN_PACKAGES='rpm').stack('pre-install')
    assert named(calls, 'install_package') == [('fuse3', 'qemu-img', 'qemu-kvm', 'bubblewrap')]


# --- the Rust toolchain ----------------------------------------------------------------------

def test_a_recent_host_cargo_builds_yolofs(tmp_path):
    node = Devstack(tmp_path, COMPUTE, cargo='1.85.0')
    calls = node.stack('install')
    assert not named(calls, 'curl')
    assert ('build', '--release', '--locked') in named(calls, 'cargo')
    # Built in the checkout, with the host's own toolchain settings.
    assert named(calls, 'cargo-env')[-1] == (str(node.checkout / 'yolofs'), '', '')


@pytest.mark.parametrize('cargo', [None, '1.63.0', '1.84.1'])
def test_rustup_installs_a_toolchain_where_cargo_is_missing_or_too_old(tmp_path, cargo):
    node = Devstack(tmp_path, COMPUTE, cargo=cargo)
    calls = node.stack('install')
    [curl] = named(calls, 'curl')
    assert curl[-1] == 'https://sh.rustup.rs' and '--proto' in curl
    [rustup] = named(calls, 'rustup-init')
    assert {'-y', '--no-modify-path'} <= set(rustup)
    assert (option(rustup, '--profile'), option(rustup, '--default-toolchain')) == (
        'minimal', 'stable')
    homes = (str(node.dest / 'yolo-rust/rustup'), str(node.dest / 'yolo-rust/cargo'))
    assert named(calls, 'rustup-env') == [homes]
    # The build runs rustup's cargo, in the checkout.
    build = calls.index(('cargo', 'build', '--release', '--locked'))
    assert calls[build + 1] == ('cargo-env', str(node.checkout / 'yolofs')) + homes
    assert calls.index(('rustup-init',) + rustup) < build
    # A second stack reuses it.
    again = node.stack('install')
    assert not named(again, 'curl') and ('build', '--release', '--locked') in named(again, 'cargo')


def test_the_toolchain_goes_where_local_conf_says(tmp_path):
    node = Devstack(tmp_path, COMPUTE, cargo=None, YOLO_RUSTUP_HOME=str(tmp_path / 'r'),
                    YOLO_CARGO_HOME=str(tmp_path / 'c'))
    calls = node.stack('install')
    assert named(calls, 'rustup-env') == [(str(tmp_path / 'r'), str(tmp_path / 'c'))]


def test_a_prebuilt_binary_needs_no_toolchain(tmp_path):
    node = Devstack(tmp_path, COMPUTE, cargo=None, YOLOFS_BIN_SOURCE='/srv/yolofs')
    calls = node.stack('install')
    assert not named(calls, 'cargo') and not named(calls, 'curl')
    assert ('install', '-m', '0755', '/srv/yolofs', '/usr/local/bin/yolofs') in \
        named(calls, 'sudo')


def test_a_yolofs_wheel_needs_no_toolchain(tmp_path):
    node = Devstack(tmp_path, COMPUTE, cargo=None, YOLOFS_WHEEL='/srv/yolofs-0.1.0.whl')
    calls = node.stack('install')
    assert not named(calls, 'cargo') and not named(calls, 'curl')
    assert ('pip_install', '/srv/yolofs-0.1.0.whl') in calls
    installed = [c for c in named(calls, 'sudo') if c[:3] == ('install', '-m', '0755')]
    assert installed == [('install', '-m', '0755', str(node.bin / 'yolofs'),
                          '/usr/local/bin/yolofs')]


def test_a_failed_download_stops_devstack(tmp_path):
    node = Devstack(tmp_path, COMPUTE, cargo=None)
    (node.bin / 'curl').unlink()
    (node.bin / 'curl').write_text('#!/bin/sh\nexit 22\n')
    (node.bin / 'curl').chmod(0o755)
    with pytest.raises(AssertionError):
        node.stack('install')
    assert 'die' in node.log.read_text()
    assert 'cargo' not in node.log.read_text()


# --- unstack and clean -----------------------------------------------------------------------

def test_unstack_stops_both_services_and_unmounts(tmp_path):
    node = Devstack(tmp_path, ALL_IN_ONE)
    worker_dir = node.dest / 'data/yolo/worker'
    node.env['FAKE_MOUNTS'] = '/\n%s/build-1/mnt\n/elsewhere/mnt\n' % worker_dir
    calls = node.run(('unstack',))
    assert named(calls, 'stop_process') == [('yolo-glance-worker',), ('yolofs',)]
    sudo = named(calls, 'sudo')
    assert ('fusermount3', '-uz', str(node.dest / 'data/nova/yolofs')) in sudo
    # The worker's learning mounts left by a killed build, and no other mount.
    assert [args for args in sudo if args[0] == 'umount'] == [
        ('umount', '-l', '%s/build-1/mnt' % worker_dir)]


def test_clean_removes_what_the_plugin_made(tmp_path):
    node = Devstack(tmp_path, ALL_IN_ONE, cargo=None)
    node.stack('install')
    toolchain = node.dest / 'yolo-rust'
    assert (toolchain / 'cargo/.installed-by-yolo').exists()
    calls = node.run(('clean',))
    data = node.dest / 'data'
    sudo = named(calls, 'sudo')
    assert ('rm', '-rf', str(data / 'yolo/boot-images'), str(data / 'yolo/worker'),
            '/etc/yolo/yolo-glance-worker.conf', '/etc/yolo') in sudo
    assert ('rm', '-f', '/usr/local/bin/yolofs') in sudo
    assert ('rmdir', str(data / 'nova/yolofs')) in sudo
    assert not (toolchain / 'cargo').exists() and not (toolchain / 'rustup').exists()
    # The package lives in devstack's venv, which devstack's clean removes.
    assert not named(calls, 'pip_uninstall')
    assert ('echo_summary', 'Cleaning YOLO') in calls


def test_clean_leaves_a_toolchain_it_did_not_install(tmp_path):
    cargo_home = tmp_path / 'own-cargo'
    (cargo_home / 'bin').mkdir(parents=True)
    node = Devstack(tmp_path, COMPUTE, YOLO_CARGO_HOME=str(cargo_home), GLOBAL_VENV='False')
    calls = node.run(('clean',))
    assert (cargo_home / 'bin').is_dir()
    assert named(calls, 'pip_uninstall') == [('yolo-openstack',)]


# --- devstack's plugin contract --------------------------------------------------------------

@pytest.mark.parametrize('xtrace', [True, False])
def test_xtrace_is_restored_and_the_plugin_is_quiet(tmp_path, xtrace):
    node = Devstack(tmp_path, ALL_IN_ONE)
    node.run(*[('stack', phase) for phase in STACK], ('unstack',), xtrace=xtrace)
    assert node.stdout.split() == ['xtrace-on' if xtrace else 'xtrace-off']
    assert 'pip_install' not in node.stderr and 'run_process' not in node.stderr


def test_run_process_commands_are_absolute_and_without_sudo(tmp_path):
    # What devstack's run_process requires of a command under systemd.
    calls = Devstack(tmp_path, ALL_IN_ONE).stack()
    commands = [args[1] for args in named(calls, 'run_process')]
    assert len(commands) == 2
    assert all(os.path.isabs(c.split()[0]) and 'sudo' not in c for c in commands)


def test_other_phases_do_nothing(tmp_path):
    calls = Devstack(tmp_path, ALL_IN_ONE).run(('stack', 'test-config'))
    assert [call[0] for call in calls] == ['define_plugin', 'enable_service']


def test_cinder_api_leaves_yolos_properties_out_of_volume_uploads(tmp_path):
    calls = Devstack(tmp_path, CONTROLLER + ',c-api').stack('post-config')
    cinder = [args for args in named(calls, 'yolo-configure') if args[0] == 'cinder-api']
    assert [option(args, '--config-file') for args in cinder] == ['/etc/cinder/cinder.conf']
    assert 'cinder-api' not in roles(Devstack(tmp_path / 'b', CONTROLLER).stack('post-config'))
