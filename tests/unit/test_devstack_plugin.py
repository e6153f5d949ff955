"""The devstack plugin on compute, controller and all-in-one nodes, run by devstack's own code.

Real: devstack itself, from ../shared/upstream/devstack beside the repository (openstack/devstack,
where CI has it; every test fails without it). A local.conf whose [[local|localrc]] section has
`enable_plugin yolo file://<this checkout> main` goes through devstack's extract_localrc_section
and stackrc; fetch_plugins clones the plugin, run_phase source loads its settings and run_phase
runs each phase, as stack.sh, unstack.sh and clean.sh do: devstack_harness/run repeats those
scripts' steps that concern plugins, in their order and under their shell options (stack.sh:
errexit and xtrace, the latter here from the plugin's settings on; neither pipefail nor nounset,
which it sets only for NOUNSET=1 and which devstack's own files do not survive; unstack.sh and
clean.sh: xtrace only). The scripts themselves refuse to run as root, and go on to install and
start OpenStack. The harness sources devstack's functions (functions-common, inc/*), stackrc,
openrc, extras.d and, of lib/*, those the plugin uses: rpc_backend, keystone, glance, nova and
cinder. install_package, pip_install, run_process, stop_process, get_or_create_user, async_wait,
die, ... are devstack's: the tests read the commands they ran and the unit files run_process
wrote.

Stubbed, because they would change the machine: devstack_harness/fake stands in for each of these
commands and records every call, which the tests read back.
  sudo         runs nothing, except the grep, sed and tee of devstack's `iniset -sudo` on a file in
               the scratch directory
  systemctl    devstack's USER_UNITS=True makes run_process write its real unit files under
               $HOME, the scratch directory, and call `systemctl --user`
  apt-get, dnf, pip     what install_package and pip_install run (pip: in devstack's venv, which
                        stack.sh makes before the pre-install phase)
  git, curl             the network (git's clone of the file:// URL is a tree of links)
  openstack             keystone, for get_or_create_user and get_or_add_user_project_role
  cargo, findmnt, yolo-configure, yolo-glance-worker
  lsb_release  devstack installs it where it is missing; and the node's distribution is each
               test's (Debian 12 unless the test says otherwise), whatever the host runs
and lib/neutron's configure_neutron_nova, which stack.sh runs in the background across the
post-config phase: it edits /etc/nova/nova.conf, so the harness' own only records when it is done.
Everything else is under pytest's tmp_path: HOME, DEST, DATA_DIR, LOGDIR, and a tree of links to
devstack's files, beside which stack.sh writes .localrc.auto and .stackenv.

A node stacked once serves every test that only reads what it did (the compute, controller and
all_in_one fixtures): each devstack run takes about a second.
"""

import configparser
import grp
import os
import pathlib
import pwd
import shlex
import subprocess
import types

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
DEVSTACK = REPO.parent / 'shared' / 'upstream' / 'devstack'
HARNESS = pathlib.Path(__file__).resolve().parent / 'devstack_harness'
# The phases of stack.sh, in its order.
STACK = ('pre-install', 'install', 'post-config', 'extra', 'test-config')
FAKES = ('sudo', 'systemctl', 'apt-get', 'dnf', 'git', 'curl', 'cargo', 'findmnt', 'openstack',
         'lsb_release')
# In devstack's venv ($DATA_DIR/venv), where pip_install puts the package's commands.
VENV_FAKES = ('pip', 'yolo-configure', 'yolo-glance-worker')
# What stack.sh writes beside stackrc: never linked from the devstack tree.
GENERATED = ('local.conf', 'localrc', '.localrc.auto', '.localrc.password', '.stackenv')
# stack.sh runs as the stack user: whoever runs the tests (stackrc's default for root, "stack",
# is a user this host may not have).
USER = pwd.getpwuid(os.getuid()).pw_name

COMPUTE = 'n-cpu,q-agt,placement-client'
CONTROLLER = 'key,mysql,rabbit,g-api,n-api,n-cond,n-sch,placement-api,q-svc'
ALL_IN_ONE = CONTROLLER + ',' + COMPUTE


class Devstack:
    """One devstack node: its services, its local.conf (VARIABLES=values, then the localrc
    lines), its host's cargo (None: none) and distribution ("vendor release codename")."""

    def __init__(self, tmp_path, services, cargo='1.91.0', localrc='', distro=None,
                 **variables):
        assert (DEVSTACK / 'stack.sh').is_file(), (
            'devstack is missing: openstack/devstack is expected at %s' % DEVSTACK)
        self.root = tmp_path
        self.top = tmp_path / 'devstack'
        self.top.mkdir(parents=True)
        for entry in DEVSTACK.iterdir():
            if entry.name not in GENERATED:
                (self.top / entry.name).symlink_to(entry)
        self.bin = tmp_path / 'bin'
        self.bin.mkdir()
        for name in FAKES:
            (self.bin / name).symlink_to(HARNESS / 'fake')
        self.dest = tmp_path / 'opt' / 'stack'
        self.data = self.dest / 'data'
        self.venv = self.data / 'venv' / 'bin'
        self.venv.mkdir(parents=True)
        for name in VENV_FAKES:
            (self.venv / name).symlink_to(HARNESS / 'fake')
        # stack.sh makes DEST, DATA_DIR and LOGDIR (with sudo) before anything else.
        (self.dest / 'logs').mkdir()
        self.checkout = self.dest / 'yolo'
        self.units = tmp_path / '.local' / 'share' / 'systemd' / 'user'
        self.log = tmp_path / 'calls'
        settings = {
            'DEST': self.dest, 'DATA_DIR': self.data, 'STACK_USER': USER,
            # Addresses given: devstack looks up none of this host's.
            'HOST_IP': '192.0.2.10', 'HOST_IPV6': '2001:db8::10', 'SERVICE_HOST': 'controller',
            'USER_UNITS': 'True',
            'ADMIN_PASSWORD': 'admin-secret', 'SERVICE_PASSWORD': 'service-secret',
            'RABBIT_PASSWORD': 'rabbit-secret', 'DATABASE_PASSWORD': 'database-secret',
            'ENABLED_SERVICES': services, **variables}
        (self.top / 'local.conf').write_text('\n'.join(
            ['[[local|localrc]]']
            + ['%s=%s' % (name, shlex.quote(str(value))) for name, value in settings.items()]
            + [localrc, 'enable_plugin yolo file://%s main' % REPO, '']))
        self.env = {
            'PATH': '%s:/usr/bin:/bin' % self.bin,
            'HOME': str(tmp_path),
            'TMPDIR': str(tmp_path),
            'TOP_DIR': str(self.top),
            'FAKE_ROOT': str(tmp_path),
            'FAKE_LOG': str(self.log),
            'FAKE_CARGO_VERSION': cargo or '',
        }
        if distro:
            self.env['FAKE_DISTRO'] = distro

    def run(self, script, *phases, xtrace=True, check=True):
        """Runs devstack's SCRIPT (stack, unstack or clean) with the phases given; returns its
        calls (tuples of the name and the arguments), stdout, stderr and returncode."""
        # unstack.sh and clean.sh read what stack.sh wrote beside stackrc.
        assert script == 'stack' or (self.top / '.localrc.auto').exists(), 'stack first'
        self.log.write_text('')
        result = subprocess.run(
            ['bash', str(HARNESS / 'run'), script, *phases], env=dict(self.env, XTRACE=str(xtrace)),
            text=True, capture_output=True, cwd=self.root, timeout=120)
        if check:
            assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
        calls = [tuple(record.split('\t')) for record in self.log.read_text().split('\0')[:-1]]
        return types.SimpleNamespace(calls=calls, stdout=result.stdout, stderr=result.stderr,
                                     returncode=result.returncode)

    def stack(self, *phases, **options):
        return self.run('stack', *(phases or STACK), **options)

    def unstack(self, **options):
        return self.run('unstack', **options)

    def clean(self):
        return self.run('clean')

    def unit(self, service):
        """The [Service] section of the unit file devstack's run_process wrote for SERVICE."""
        unit = configparser.ConfigParser(interpolation=None, strict=False)
        unit.optionxform = str
        assert unit.read(self.units / ('devstack@%s.service' % service))
        return dict(unit['Service'])


@pytest.fixture(scope='module')
def compute(tmp_path_factory):
    node = Devstack(tmp_path_factory.mktemp('compute'), COMPUTE)
    node.stacked = node.stack()
    return node


@pytest.fixture(scope='module')
def controller(tmp_path_factory):
    node = Devstack(tmp_path_factory.mktemp('controller'), CONTROLLER)
    node.stacked = node.stack()
    return node


@pytest.fixture(scope='module')
def all_in_one(tmp_path_factory):
    """Stacked, with devstack's configure_neutron_nova taking half a second; then unstacked,
    with the mount of a killed worker's learning boot left among others."""
    node = Devstack(tmp_path_factory.mktemp('all-in-one'), ALL_IN_ONE)
    node.env['FAKE_NEUTRON_NOVA_SECS'] = '0.5'
    node.stacked = node.stack()
    node.worker_mount = node.data / 'yolo/worker/build-1/mnt'
    node.env['FAKE_MOUNTS'] = '/\n%s\n/elsewhere/mnt\n' % node.worker_mount
    node.unstacked = node.unstack()
    return node


def by_phase(calls):
    """The calls of each phase of a stack, in order (the harness notes xtrace after each; the
    calls of stack.sh's steps before the first phase go with it)."""
    phases = [[]]
    for call in calls:
        if call[0] == 'xtrace':
            phases.append([])
        else:
            phases[-1].append(call)
    return phases[:-1]


def named(calls, name):
    return [call[1:] for call in calls if call[0] == name]


def ran(calls, command):
    """The arguments of each run of COMMAND: directly, or by sudo (whose options and VAR=value
    settings are left out). devstack runs apt-get and dnf with sudo, or as root with env."""
    found = []
    for call in calls:
        if call[0] == 'sudo':
            call = call[1:]
            while call and (call[0].startswith('-') or '=' in call[0]):
                call = call[1:]
        if call and call[0] == command:
            found.append(call[1:])
    return found


def installed(calls):
    """The packages of each apt-get install."""
    return [args[args.index('install') + 1:] for args in ran(calls, 'apt-get')
            if 'install' in args]


def roles(calls):
    return [args[0] for args in named(calls, 'yolo-configure')]


def option(args, name):
    return args[args.index(name) + 1]


def started(calls):
    """The services systemd was asked to start (devstack@NAME.service units)."""
    return [args[-1][len('devstack@'):-len('.service')] for args in named(calls, 'systemctl')
            if args[:2] == ('--user', 'start')]


def keystone(calls):
    """The openstack commands, without devstack's --os-cloud devstack-system-admin."""
    commands = named(calls, 'openstack')
    assert all(args[:2] == ('--os-cloud', 'devstack-system-admin') for args in commands)
    return [args[2:] for args in commands]


def plugin_calls(calls):
    """The calls left once devstack's own are left out: fetch_plugins' (git), the background
    configure_neutron_nova, and the harness' notes of xtrace."""
    return [call for call in calls if call[0] not in ('git', 'configure_neutron_nova', 'xtrace')
            and call[:2] != ('sudo', 'git')]


def test_local_conf_enables_the_plugin_and_its_services(compute):
    calls = compute.stacked.calls
    # fetch_plugins clones the plugin's main branch (devstack's default, master, is not one).
    assert named(calls, 'git')[:3] == [
        ('clone', '--no-checkout', 'file://%s' % REPO, str(compute.checkout)),
        ('fetch', 'origin', 'main'), ('checkout', 'FETCH_HEAD')]
    assert 'Loading plugin settings' in compute.stacked.stdout
    # stack.sh saves what its other scripts need in .stackenv: the services, with the plugin's.
    stackenv = dict(line.split('=', 1) for line in
                    (compute.top / '.stackenv').read_text().splitlines()[1:])
    assert stackenv['ENABLED_SERVICES'] == COMPUTE + ',yolofs,yolo-glance-worker'


def test_a_compute_node_runs_yolofs_and_the_driver_only(compute):
    calls = compute.stacked.calls
    assert installed(calls) == [('fuse3', 'qemu-utils')]
    assert roles(calls) == ['nova-compute']
    nova_compute = named(calls, 'yolo-configure')[0]
    assert option(nova_compute, '--config-file') == '/etc/nova/nova.conf'
    assert option(nova_compute, '--mount-point') == str(compute.data / 'nova/yolofs')
    assert option(nova_compute, '--control-socket') == '/run/yolofs/control.sock'
    assert started(calls) == ['yolofs']
    assert not named(calls, 'openstack')
    # The binary is built and installed; the package installed from the checkout, not editable,
    # with devstack's constraints.
    assert ('install', '-m', '0755', str(compute.checkout / 'yolofs/target/release/yolofs'),
            '/usr/local/bin/yolofs') in named(calls, 'sudo')
    assert named(calls, 'pip') == [
        ('install', '-c', str(compute.dest / 'requirements/upper-constraints.txt'),
         str(compute.checkout) + '[re2]')]


def test_yolofs_runs_as_root_with_the_socket_for_nova_computes_group(compute):
    calls = compute.stacked.calls
    unit = compute.unit('yolofs')
    assert unit['User'] == 'root' and 'Group' not in unit
    data = compute.data
    assert unit['ExecStart'].split() == [
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
    # Started in post-config (only), after nova.conf has the driver and a dead mount is detached.
    phases = by_phase(calls)
    assert [started(phase) for phase in phases] == [[], [], ['yolofs'], [], []]
    post_config = phases[STACK.index('post-config')]
    assert post_config.index(('yolo-configure',) + named(calls, 'yolo-configure')[0]) < \
        post_config.index(('sudo', 'fusermount3', '-uz', str(data / 'nova/yolofs'))) < \
        post_config.index(('systemctl', '--user', 'start', 'devstack@yolofs.service'))


def test_without_libvirt_the_socket_gets_the_stack_users_group(tmp_path):
    # stackrc sets LIBVIRT_GROUP for the libvirt driver only.
    node = Devstack(tmp_path, COMPUTE, VIRT_DRIVER='fake')
    node.stack('post-config')
    group = grp.getgrgid(pwd.getpwnam(USER).pw_gid).gr_name
    assert option(node.unit('yolofs')['ExecStart'].split(), '--control-socket-group') == group


def test_a_controller_runs_the_scheduler_api_and_glance_parts_and_the_worker(controller):
    calls = controller.stacked.calls
    # No cinder-api without c-api.
    assert roles(calls) == ['glance-api', 'worker', 'nova-scheduler', 'nova-api']
    assert 'yolofs' not in started(calls)
    # The worker's learning mounts and profiling boots need yolofs and QEMU here too.
    assert installed(calls) == [('fuse3', 'qemu-utils', 'qemu-system-x86', 'bubblewrap')]
    assert '/usr/local/bin/yolofs' in [args[-1] for args in named(calls, 'sudo')]
    glance = named(calls, 'yolo-configure')[0]
    assert option(glance, '--config-file') == '/etc/glance/glance-api.conf'
    assert option(glance, '--import-config-file') == '/etc/glance/glance-image-import.conf'
    assert option(glance, '--property-protection-file') == \
        '/etc/glance/property-protections.conf'


def test_the_worker_starts_in_extra_as_the_stack_user(controller):
    phases = by_phase(controller.stacked.calls)
    assert [started(calls) for calls in phases] == [[], [], [], ['yolo-glance-worker'], []]
    # No group or user given: run_process runs it as the stack user.
    unit = controller.unit('yolo-glance-worker')
    assert unit['ExecStart'] == \
        '%s/yolo-glance-worker --config-file /etc/yolo/yolo-glance-worker.conf' % controller.venv
    assert unit['User'] == USER and 'Group' not in unit


def test_the_worker_has_a_keystone_user_of_its_own(controller):
    calls = by_phase(controller.stacked.calls)[STACK.index('post-config')]
    openstack = keystone(calls)
    assert [args for args in openstack if args[:2] == ('user', 'create')] == [
        ('user', 'create', 'yolo', '--password', 'service-secret', '--domain=default',
         '--or-show', '-f', 'value', '-c', 'id')]
    assert [args for args in openstack if args[:2] == ('role', 'add')] == [
        ('role', 'add', 'admin', '--user', 'id-of-yolo', '--project', 'service'),
        ('role', 'add', 'service', '--user', 'id-of-yolo', '--project', 'service')]
    worker = named(calls, 'yolo-configure')[1]
    assert (option(worker, '--username'), option(worker, '--project-name')) == (
        'yolo', 'service')
    # The password on standard input, not on yolo-configure's command line.
    assert '--password-stdin' in worker and 'service-secret' not in worker
    assert named(calls, 'yolo-configure-stdin') == [('service-secret',)]
    assert option(worker, '--transport-url') == \
        'rabbit://stackrabbit:rabbit-secret@controller:5672/'
    assert option(worker, '--auth-url') == 'http://controller/identity'
    assert option(worker, '--yolofs-binary') == '/usr/local/bin/yolofs'
    assert option(worker, '--work-dir') == str(controller.data / 'yolo/worker')
    assert 'admin-secret' not in controller.log.read_text()


def test_the_workers_password_and_user_can_be_set(tmp_path):
    node = Devstack(tmp_path, CONTROLLER, YOLO_SERVICE_PASSWORD='yolo-secret',
                    YOLO_SERVICE_USER='boot-images')
    calls = node.stack('post-config').calls
    [create] = [args for args in keystone(calls) if args[:2] == ('user', 'create')]
    assert (create[2], option(create, '--password')) == ('boot-images', 'yolo-secret')
    worker = named(calls, 'yolo-configure')[1]
    assert option(worker, '--username') == 'boot-images'
    assert named(calls, 'yolo-configure-stdin') == [('yolo-secret',)]
    assert 'service-secret' not in node.log.read_text()


def test_an_all_in_one_node_runs_everything(all_in_one):
    calls = all_in_one.stacked.calls
    # The worker first: its signing key's public key goes to the compute node.
    assert roles(calls) == ['glance-api', 'worker', 'nova-compute', 'nova-scheduler', 'nova-api']
    worker = named(calls, 'yolo-configure')[1]
    assert option(worker, '--signing-key-file') == '/etc/yolo/boot-image-signing.key'
    assert started(calls) == ['yolofs', 'yolo-glance-worker']
    summaries = ("Installing YOLO's system packages", 'Installing YOLO', 'Configuring YOLO',
                 'Starting yolo-glance-worker')
    assert [line for line in all_in_one.stacked.stdout.splitlines() if line in summaries] == \
        list(summaries)


def test_nova_conf_is_rewritten_only_once_devstacks_own_edit_of_it_is_done(all_in_one):
    calls = all_in_one.stacked.calls
    done = calls.index(('configure_neutron_nova', 'done'))
    nova = [index for index, call in enumerate(calls)
            if call[0] == 'yolo-configure' and call[1].startswith('nova-')]
    assert len(nova) == 3 and min(nova) > done
    # stack.sh's own wait for it, after the phase, then finds it done.
    assert 'Not waiting for async task configure_neutron_nova that we never started or has ' \
        'already been waited for' in all_in_one.stacked.stdout


def test_a_compute_node_gets_the_workers_public_key_where_it_is_given(tmp_path):
    public_key = tmp_path / 'controller-key.pub'
    public_key.write_text('the public key\n')
    calls = Devstack(tmp_path / 'a', COMPUTE,
                     YOLO_SIGNING_PUBLIC_KEY_FILE=public_key).stack('post-config').calls
    nova_compute = named(calls, 'yolo-configure')[0]
    assert option(nova_compute, '--boot-image-signing-key-file') == str(public_key)
    node = Devstack(tmp_path / 'b', COMPUTE,
                    YOLO_SIGNING_PUBLIC_KEY_FILE=tmp_path / 'not-copied.pub')
    stack = node.stack('post-config')
    assert '--boot-image-signing-key-file' not in named(stack.calls, 'yolo-configure')[0]
    assert 'no first boot before a download here' in stack.stderr


def test_a_disabled_service_is_left_out(tmp_path):
    stack = Devstack(tmp_path, ALL_IN_ONE, localrc='disable_service yolo-glance-worker').stack()
    # The plugin's enable_service (in its settings) leaves it disabled.
    assert 'Attempt to enable_service yolo-glance-worker when it has been disabled' in \
        stack.stdout
    assert roles(stack.calls) == ['nova-compute', 'nova-scheduler', 'nova-api']
    assert started(stack.calls) == ['yolofs']
    assert not named(stack.calls, 'openstack')


def test_a_compute_node_without_yolofs_gets_nothing_of_it(tmp_path):
    calls = Devstack(tmp_path / 'a', COMPUTE, localrc='disable_service yolofs').stack().calls
    assert not roles(calls) and not started(calls) and not installed(calls)
    assert not named(calls, 'cargo')
    nothing = Devstack(tmp_path / 'b', ALL_IN_ONE,
                       localrc='disable_service yolofs yolo-glance-worker').stack()
    assert not plugin_calls(nothing.calls)


def test_the_scheduler_part_can_be_turned_off(tmp_path):
    calls = Devstack(tmp_path, CONTROLLER, YOLO_SCHEDULER='False').stack('post-config').calls
    assert roles(calls) == ['glance-api', 'worker', 'nova-api']


def test_paths_and_options_come_from_local_conf(tmp_path):
    node = Devstack(tmp_path, COMPUTE, YOLOFS_MOUNTPOINT='/srv/yolofs',
                    YOLOFS_OPTIONS='--threads 8', YOLOFS_SOCKET_GROUP='nova',
                    YOLOFS_BIN='/opt/bin/yolofs')
    calls = node.stack('post-config').calls
    assert option(named(calls, 'yolo-configure')[0], '--mount-point') == '/srv/yolofs'
    command = node.unit('yolofs')['ExecStart'].split()
    assert command[0] == '/opt/bin/yolofs'
    assert option(command, '--mountpoint') == '/srv/yolofs'
    assert option(command, '--control-socket-group') == 'nova'
    assert command[-2:] == ['--threads', '8']


def test_other_distributions_get_their_package_names(tmp_path):
    node = Devstack(tmp_path, CONTROLLER, distro='RockyLinux 9.6 Blue-Onyx')
    calls = node.stack('pre-install').calls
    assert not ran(calls, 'apt-get')
    assert ran(calls, 'dnf') == [('install', '-y', 'fuse3', 'qemu-img', 'qemu-kvm', 'bubblewrap')]


# --- the Rust toolchain ----------------------------------------------------------------------

def test_a_recent_host_cargo_builds_yolofs(tmp_path):
    node = Devstack(tmp_path, COMPUTE, cargo='1.85.0')
    calls = node.stack('install').calls
    assert not named(calls, 'curl')
    assert ('build', '--release', '--locked') in named(calls, 'cargo')
    # Built in the checkout, with the host's own toolchain settings.
    assert named(calls, 'cargo-env')[-1] == (str(node.checkout / 'yolofs'), '', '')


@pytest.mark.parametrize('cargo', [None, '1.63.0', '1.84.1'])
def test_rustup_installs_a_toolchain_where_cargo_is_missing_or_too_old(tmp_path, cargo):
    node = Devstack(tmp_path, COMPUTE, cargo=cargo)
    # The second install: what that of a second stack finds.
    calls, again = by_phase(node.stack('install', 'install').calls)
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
    assert not named(again, 'curl') and ('build', '--release', '--locked') in named(again, 'cargo')


def test_the_toolchain_goes_where_local_conf_says(tmp_path):
    node = Devstack(tmp_path, COMPUTE, cargo=None, YOLO_RUSTUP_HOME=tmp_path / 'r',
                    YOLO_CARGO_HOME=tmp_path / 'c')
    calls = node.stack('install').calls
    assert named(calls, 'rustup-env') == [(str(tmp_path / 'r'), str(tmp_path / 'c'))]


def test_a_prebuilt_binary_needs_no_toolchain(tmp_path):
    node = Devstack(tmp_path, COMPUTE, cargo=None, YOLOFS_BIN_SOURCE='/srv/yolofs')
    calls = node.stack('install').calls
    assert not named(calls, 'cargo') and not named(calls, 'curl')
    assert ('install', '-m', '0755', '/srv/yolofs', '/usr/local/bin/yolofs') in \
        named(calls, 'sudo')


def test_a_yolofs_wheel_needs_no_toolchain(tmp_path):
    node = Devstack(tmp_path, COMPUTE, cargo=None, YOLOFS_WHEEL='/srv/yolofs-0.1.0.whl')
    calls = node.stack('install').calls
    assert not named(calls, 'cargo') and not named(calls, 'curl')
    assert [args[-1] for args in named(calls, 'pip')] == [
        '/srv/yolofs-0.1.0.whl', str(node.checkout) + '[re2]']
    installs = [c for c in named(calls, 'sudo') if c[:3] == ('install', '-m', '0755')]
    assert installs == [('install', '-m', '0755', str(node.venv / 'yolofs'),
                         '/usr/local/bin/yolofs')]


def test_a_failed_download_stops_devstack(tmp_path):
    node = Devstack(tmp_path, COMPUTE, cargo=None)
    (node.bin / 'curl').unlink()
    (node.bin / 'curl').write_text('#!/bin/sh\nexit 22\n')
    (node.bin / 'curl').chmod(0o755)
    stack = node.stack('install', 'post-config', check=False)
    # devstack's die, with the plugin's message and curl's status.
    assert stack.returncode == 22
    assert '[ERROR] %s/devstack/plugin.sh:' % node.checkout in stack.stderr
    assert "cannot download rustup's installer from https://sh.rustup.rs" in stack.stderr
    assert not named(stack.calls, 'cargo') and not named(stack.calls, 'pip')
    assert not named(stack.calls, 'yolo-configure')


# --- unstack and clean -----------------------------------------------------------------------

def test_unstack_stops_both_services_and_unmounts(all_in_one):
    calls = all_in_one.unstacked.calls
    assert [args for args in named(calls, 'systemctl') if args[1] == 'stop'] == [
        ('--user', 'stop', 'devstack@yolo-glance-worker.service'),
        ('--user', 'stop', 'devstack@yolofs.service')]
    assert 'Stopping YOLO' in all_in_one.unstacked.stdout.splitlines()
    sudo = named(calls, 'sudo')
    assert ('fusermount3', '-uz', str(all_in_one.data / 'nova/yolofs')) in sudo
    # The worker's learning mounts left by a killed build, and no other mount.
    assert [args for args in sudo if args[0] == 'umount'] == [
        ('umount', '-l', str(all_in_one.worker_mount))]


def test_clean_removes_what_the_plugin_made(tmp_path):
    node = Devstack(tmp_path, ALL_IN_ONE, cargo=None)
    node.stack('install')
    toolchain = node.dest / 'yolo-rust'
    assert (toolchain / 'cargo/.installed-by-yolo').exists()
    clean = node.clean()
    data = node.data
    sudo = named(clean.calls, 'sudo')
    # clean.sh runs unstack.sh first.
    assert clean.calls.index(('sudo', 'fusermount3', '-uz', str(data / 'nova/yolofs'))) < \
        clean.calls.index(('sudo', 'rm', '-f', '/usr/local/bin/yolofs'))
    assert ('rm', '-rf', str(data / 'yolo/boot-images'), str(data / 'yolo/worker'),
            '/etc/yolo/yolo-glance-worker.conf', '/etc/yolo') in sudo
    assert ('rmdir', str(data / 'nova/yolofs')) in sudo
    assert ('rmdir', '/run/yolofs') in sudo
    assert not (toolchain / 'cargo').exists() and not (toolchain / 'rustup').exists()
    # The package lives in devstack's venv, which devstack's clean removes.
    assert not [args for args in clean.calls if 'uninstall' in args]
    assert 'Cleaning YOLO' in clean.stdout.splitlines()


def test_clean_leaves_a_toolchain_it_did_not_install(tmp_path):
    cargo_home = tmp_path / 'own-cargo'
    (cargo_home / 'bin').mkdir(parents=True)
    node = Devstack(tmp_path, COMPUTE, YOLO_CARGO_HOME=cargo_home, GLOBAL_VENV='False')
    node.run('stack')
    calls = node.clean().calls
    assert (cargo_home / 'bin').is_dir()
    # Outside devstack's venv: devstack's pip_uninstall, with the system's pip.
    [uninstall] = [args for args in named(calls, 'sudo') if 'uninstall' in args]
    assert uninstall[-5:] == ('-m', 'pip', 'uninstall', '-y', 'yolo-openstack')


# --- devstack's plugin contract --------------------------------------------------------------

def traced(stderr):
    """The lines of an xtrace (PS4 is stackrc's: "+ FILE:FUNCTION:LINE :   COMMAND"), as
    (file, function, command)."""
    lines = []
    for line in stderr.splitlines():
        if line.startswith('+') and ' :   ' in line:
            where, command = line.lstrip('+ ').split(' :   ', 1)
            file, function, _ = where.strip().rsplit(':', 2)
            lines.append((file, function, command))
    return lines


def test_xtrace_is_restored_and_the_plugin_is_quiet(all_in_one):
    calls = all_in_one.stacked.calls + all_in_one.unstacked.calls
    assert named(calls, 'xtrace') == [('on',)] * (len(STACK) + 1)
    trace = traced(all_in_one.stacked.stderr) + traced(all_in_one.unstacked.stderr)
    plugin = str(all_in_one.checkout / 'devstack/plugin.sh')
    # Traced in plugin.sh: only what turns xtrace off (in its settings: everything).
    assert {command for file, _, command in trace if file == plugin} == {
        'set +o', 'grep xtrace', "_XTRACE_YOLO='set -o xtrace'", 'set +o xtrace'}
    functions = {function for _, function, _ in trace}
    assert 'load_plugin_settings' in functions
    assert not functions & {'pip_install', 'run_process', 'install_package', 'stop_process',
                            'configure_yolo', 'install_yolo', 'stop_yolo'}


def test_xtrace_stays_off_where_it_was_off(tmp_path):
    node = Devstack(tmp_path, ALL_IN_ONE)
    stack, unstack = node.stack(xtrace=False), node.unstack(xtrace=False)
    assert named(stack.calls + unstack.calls, 'xtrace') == [('off',)] * (len(STACK) + 1)
    # (devstack's async_inner traces its background job whatever the shell's xtrace.)
    assert not [line for line in traced(stack.stderr + unstack.stderr) if line[0] != 'inc/async']


def test_run_process_commands_are_absolute_and_without_sudo(all_in_one):
    # What devstack's run_process requires of a command under systemd (it dies otherwise).
    commands = [all_in_one.unit(service)['ExecStart']
                for service in ('yolofs', 'yolo-glance-worker')]
    assert all(os.path.isabs(c.split()[0]) and 'sudo' not in c for c in commands)


def test_other_phases_do_nothing(all_in_one):
    assert not plugin_calls(by_phase(all_in_one.stacked.calls)[STACK.index('test-config')])


def test_cinder_api_leaves_yolos_properties_out_of_volume_uploads(tmp_path):
    calls = Devstack(tmp_path, CONTROLLER + ',c-api').stack('post-config').calls
    cinder = [args for args in named(calls, 'yolo-configure') if args[0] == 'cinder-api']
    assert [option(args, '--config-file') for args in cinder] == ['/etc/cinder/cinder.conf']
