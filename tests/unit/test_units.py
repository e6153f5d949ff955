"""The systemd units in etc/: read as systemd reads them (no systemd runs here)."""

import pathlib
import shlex

from yolo_glance import service as service_mod

REPO = pathlib.Path(__file__).resolve().parents[2]
# Options that give a service a mount namespace of its own: a FUSE mount made there is seen by
# nobody else (systemd.exec(5), "Sandboxing").
MOUNT_NAMESPACE_OPTIONS = {
    'PrivateTmp', 'PrivateDevices', 'PrivateMounts', 'ProtectSystem', 'ProtectHome',
    'ProtectKernelTunables', 'ProtectKernelModules', 'ProtectKernelLogs', 'ProtectControlGroups',
    'ProtectProc', 'ProcSubset', 'ReadWritePaths', 'ReadOnlyPaths', 'InaccessiblePaths',
    'TemporaryFileSystem', 'BindPaths', 'BindReadOnlyPaths', 'RootDirectory', 'RootImage',
    'MountAPIVFS', 'PrivateUsers', 'ProtectHostname', 'ProtectClock'}


def unit(name):
    """{section: {key: [values, in order]}}: systemd's keys may repeat (Environment=)."""
    sections, section = {}, None
    for line in (REPO / 'etc' / name).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(('#', ';')):
            continue
        if line.startswith('['):
            section = sections.setdefault(line.strip('[]'), {})
            continue
        key, _, value = line.partition('=')
        section.setdefault(key, []).append(value)
    return sections


def one(section, key):
    [value] = section[key]
    return value


def environment(service):
    """Environment= assignments, each line split as systemd splits it (shell-like quoting)."""
    env = {}
    for line in service['Environment']:
        for assignment in shlex.split(line):
            key, _, value = assignment.partition('=')
            env[key] = value
    return env


def exec_start(service, env):
    """ExecStart's arguments: $VAR split into words, ${VAR} one word (systemd.service(5))."""
    args = []
    for word in one(service, 'ExecStart').split():
        if word.startswith('$') and not word.startswith('${'):
            args += env[word[1:]].split()
        else:
            for key, value in env.items():
                word = word.replace('${%s}' % key, value)
            args.append(word)
    return args


def test_yolofs_gets_every_default_option():
    service = unit('yolofs.service')['Service']
    args = exec_start(service, environment(service))
    assert args[:5] == ['/usr/local/bin/yolofs', 'keep', '--', '/usr/local/bin/yolofs', 'mount']
    for flag in ('--learn', '--mlock', '--pin-qemu', '--metrics-address'):
        assert flag in args, args
    assert args[args.index('--record-idle-secs') + 1] == '30'
    assert args[args.index('--mountpoint') + 1] == '/var/lib/nova/yolofs'
    assert args[args.index('--control-socket-group') + 1] == 'nova'


def test_yolofs_restarts_stays_visible_and_is_reclaimed_last():
    parsed = unit('yolofs.service')
    service = parsed['Service']
    assert one(service, 'Restart') == 'on-failure'
    assert one(parsed['Unit'], 'StartLimitIntervalSec') == '0'
    assert one(service, 'KillMode') == 'mixed' and one(service, 'KillSignal') == 'SIGTERM'
    assert -1000 < int(one(service, 'OOMScoreAdjust')) <= -500
    assert one(service, 'RuntimeDirectoryPreserve') == 'restart'
    # The mount outlives yolofs' restarts: the keeper holds it, and systemd holds it for the keeper.
    assert int(one(service, 'FileDescriptorStoreMax')) >= 1
    assert one(service, 'ExecReload') == '/bin/kill -HUP $MAINPID'
    assert not MOUNT_NAMESPACE_OPTIONS & set(service), 'the mount would be private to yolofs'
    assert 'CAP_SYS_ADMIN' in one(service, 'CapabilityBoundingSet')
    # Base files are nova's: leasing them takes CAP_LEASE.
    assert 'CAP_LEASE' in one(service, 'CapabilityBoundingSet').split()
    # yolofs makes its mount point itself, after detaching a dead mount there.
    assert 'ExecStartPre' not in service


def test_the_worker_never_runs_as_root():
    service = unit('yolo-glance-worker.service')['Service']
    assert one(service, 'User') == one(service, 'Group') == 'yolo'
    # oslo.service stops and reloads it; the builds under way are given their time.
    assert one(service, 'KillMode') == 'mixed'
    assert one(service, 'ExecReload') == '/bin/kill -HUP $MAINPID'
    assert int(one(service, 'TimeoutStopSec')) > service_mod.GRACEFUL_STOP_SECONDS
    # Its learning mounts go through the setuid fusermount3.
    assert service.get('NoNewPrivileges', ['no']) == ['no']
