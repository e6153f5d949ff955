"""``yolo-rollback`` on real qcow2 disks: every instance disk back on ``_base``, data unchanged.

Real ``qemu-img`` and ``qemu-io``; the "mount" is a plain directory holding a copy of the base
file (the command never reads through it), and a running guest is stood in for by ``qemu-nbd``
holding its disk open, which takes the same image lock as QEMU. No guest is booted.
"""

import json
import os
import pathlib
import pwd
import random
import shutil
import subprocess
import tempfile
import time
import uuid

import psutil
import pytest

from yolo_common import images
from yolo_nova.cmd import rollback

SIZE = 4 << 20
NAME = images.base_file_name(str(uuid.uuid4()))
MISSING = images.base_file_name(str(uuid.uuid4()))

# Other users' QEMU processes (CI boots guests beside this test) are visible only to root.
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason='needs root to see QEMU processes')


def qemu_img(*args):
    return subprocess.run(['qemu-img', *map(str, args)], check=True, capture_output=True,
                          text=True).stdout


def backing(disk):
    info = json.loads(qemu_img('info', '-U', '--output=json', disk))
    return info.get('backing-filename'), info.get('backing-filename-format')


def contents(disk, tmp_path):
    """The bytes a guest reads from ``disk``: its overlay over its backing file."""
    out = tmp_path / ('read-%s.raw' % uuid.uuid4().hex)
    qemu_img('convert', '-U', '-O', 'raw', disk, out)
    data = out.read_bytes()
    out.unlink()
    return data


class Node:
    """An instances directory with ``_base``, a stand-in mount and instance disks."""

    def __init__(self, tmp_path):
        self.instances = tmp_path / 'instances'
        self.base_dir = self.instances / '_base'
        self.mount = tmp_path / 'yolofs'
        self.base_dir.mkdir(parents=True)
        self.mount.mkdir()
        data = random.Random(5).randbytes(SIZE)
        (self.base_dir / NAME).write_bytes(data)
        (self.mount / NAME).write_bytes(data)
        # On the mount only: its _base file was removed.
        (self.mount / MISSING).write_bytes(data)
        self.disks = {}

    def disk(self, instance, backing_file, written=None):
        directory = self.instances / instance
        directory.mkdir()
        (directory / 'console.log').write_text('not a disk\n')
        disk = directory / 'disk'
        qemu_img('create', '-q', '-f', 'qcow2', '-F', 'raw', '-b', backing_file, disk)
        if written:
            # Guest writes in the overlay, over part of the backing file.
            subprocess.run(['qemu-io', '-f', 'qcow2', '-c', 'write -P 0x5a %d %d' % written,
                            str(disk)], check=True, capture_output=True)
        self.disks[instance] = disk
        return disk

    def run(self, capsys, *args):
        code = rollback.main(['--instances-path', str(self.instances),
                              '--mount-point', str(self.mount), *args])
        return code, capsys.readouterr()

    def run_json(self, capsys, *args):
        code, out = self.run(capsys, '--format', 'json', *args)
        report = json.loads(out.out)
        return code, {r['instance']: r for r in report['disks']}, report


@pytest.fixture
def node(tmp_path):
    node = Node(tmp_path)
    node.disk('stopped', node.mount / NAME, written=(65536, 131072))
    node.disk('stopped-2', node.mount / NAME)
    node.disk('on-base', node.base_dir / NAME)
    node.disk('no-base', node.mount / MISSING)
    node.disk('running', node.mount / NAME, written=(0, 4096))
    # A raw disk (config drive) and a flat qcow2 without a backing file are no concern.
    (node.instances / 'stopped' / 'disk.config').write_bytes(b'\0' * 4096)
    qemu_img('create', '-q', '-f', 'qcow2', node.instances / 'on-base' / 'disk.eph', '1M')
    return node


@pytest.fixture
def running(node, tmp_path):
    """qemu-nbd holding the 'running' instance's disk open and locked, as its QEMU would."""
    disk = node.disks['running']
    proc = subprocess.Popen(['qemu-nbd', '--socket', str(tmp_path / 'nbd.sock'), '--format',
                             'qcow2', '--persistent', str(disk)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while str(disk) not in [f.path for f in psutil.Process(proc.pid).open_files()]:
        assert proc.poll() is None and time.monotonic() < deadline, 'qemu-nbd did not start'
        time.sleep(0.05)
    yield proc
    if proc.poll() is None:
        proc.terminate()
        proc.wait(10)


def test_dry_run_reports_and_changes_nothing(node, running, capsys):
    code, disks, report = node.run_json(capsys)
    assert code == 1 and report['mode'] == 'dry-run'
    assert {i: d['state'] for i, d in disks.items()} == {
        'stopped': 'to_rewrite', 'stopped-2': 'to_rewrite', 'on-base': 'on_base',
        'no-base': 'no_base_file', 'running': 'in_use'}
    assert disks['running']['pids'] == [running.pid]
    assert disks['stopped']['base_file'] == str(node.base_dir / NAME)
    assert report['left_on_mount'] == 4
    for instance in ('stopped', 'stopped-2', 'running'):
        assert backing(node.disks[instance]) == (str(node.mount / NAME), 'raw')
    # --dry-run is the default.
    assert node.run_json(capsys, '--dry-run')[1] == disks


def test_apply_rewrites_stopped_disks_only(node, running, capsys, tmp_path):
    before = {i: contents(d, tmp_path) for i, d in node.disks.items()}

    code, out = node.run(capsys, '--apply')
    assert code == 1
    assert '%s: rewritten' % node.disks['stopped'] in out.out
    assert 'open in QEMU (pid %d)' % running.pid in out.out
    assert 'yolofs must keep running' in out.out
    assert '%s does not exist' % (node.base_dir / MISSING) in out.out

    for instance in ('stopped', 'stopped-2', 'on-base'):
        assert backing(node.disks[instance]) == (str(node.base_dir / NAME), 'raw')
    assert backing(node.disks['running']) == (str(node.mount / NAME), 'raw')
    assert backing(node.disks['no-base']) == (str(node.mount / MISSING), 'raw')
    # The guests read the same bytes, now from _base: even with the mount's copy gone.
    (node.mount / NAME).unlink()
    for instance in ('stopped', 'stopped-2', 'on-base'):
        assert contents(node.disks[instance], tmp_path) == before[instance]

    # The guest stops (its QEMU exits): the next run moves its disk too.
    running.terminate()
    running.wait(10)
    code, disks, report = node.run_json(capsys, '--apply')
    assert disks['running']['state'] == 'rewritten'
    assert contents(node.disks['running'], tmp_path) == before['running']
    assert code == 1 and report['left_on_mount'] == 1   # no-base

    # Nova downloads the missing base file when the instance starts; then nothing is left.
    (node.base_dir / MISSING).write_bytes((node.mount / MISSING).read_bytes())
    code, out = node.run(capsys, '--apply')
    assert code == 0
    assert 'No instance disk is backed by the yolofs mount.' in out.out
    assert backing(node.disks['no-base']) == (str(node.base_dir / MISSING), 'raw')
    code, disks, report = node.run_json(capsys)
    assert code == 0 and report['counts'] == {'on_base': 5}


def test_only_the_disks_nova_made_are_read_and_rewritten(node, capsys):
    """A guest writes its console log, and can make it look like a qcow2 header over the mount:
    it is neither inspected nor rewritten (as root). An instance's disk.info, Nova's record of
    its disks, decides which files are its disks."""
    console = node.instances / 'stopped' / 'console.log'
    console.unlink()
    qemu_img('create', '-q', '-f', 'qcow2', '-F', 'raw', '-b', node.mount / NAME, console)
    named = node.instances / 'named'
    named.mkdir()
    for name in ('root.qcow2', 'disk'):
        qemu_img('create', '-q', '-f', 'qcow2', '-F', 'raw', '-b', node.mount / NAME,
                 named / name)
    (named / 'disk.info').write_text(json.dumps({str(named / 'root.qcow2'): 'qcow2',
                                                 '/etc/shadow': 'qcow2'}))
    code, out = node.run(capsys, '--apply')
    assert str(console) not in out.out
    assert backing(console) == (str(node.mount / NAME), 'raw')
    assert '%s: rewritten' % (named / 'root.qcow2') in out.out
    assert backing(named / 'root.qcow2') == (str(node.base_dir / NAME), 'raw')
    # Not in its disk.info: not one of its disks.
    assert backing(named / 'disk') == (str(node.mount / NAME), 'raw')


@pytest.fixture
def shared_node():
    """A node in a directory other users may enter, as /var/lib/nova/instances is (pytest's
    own directories are root's only)."""
    top = pathlib.Path(tempfile.mkdtemp(prefix='yolo-rollback-test.', dir='/var/tmp'))
    top.chmod(0o755)
    yield Node(top)
    shutil.rmtree(top)


def test_qemu_img_has_no_more_than_the_disks_owners_rights(shared_node, capsys):
    """qemu-img runs as each disk's owner without root's capabilities: a disk its owner may
    rewrite is rewritten (and keeps its owner); one its owner may not read is not read, where
    root could read it."""
    node = shared_node
    nobody = pwd.getpwnam('nobody')
    for instance, mode in (('owned', 0o644), ('unreadable', 0o200)):
        disk = node.disk(instance, node.mount / NAME)
        os.chown(disk, nobody.pw_uid, nobody.pw_gid)
        disk.chmod(mode)
    code, disks, _ = node.run_json(capsys, '--apply')
    assert disks['owned']['state'] == 'rewritten'
    assert backing(node.disks['owned']) == (str(node.base_dir / NAME), 'raw')
    assert os.stat(node.disks['owned']).st_uid == nobody.pw_uid
    assert disks['unreadable']['state'] == 'failed'
    assert 'Permission denied' in disks['unreadable']['error']


def test_qemu_img_runs_on_qcow2_only_and_within_novas_limits(node, capsys, monkeypatch):
    """Every qemu-img names its format (no probing of a guest's bytes) and runs under Nova's
    limits of qemu-img."""
    commands = []
    real_execute = rollback.processutils.execute

    def execute(*command, **kwargs):
        commands.append((command, kwargs.get('prlimit')))
        return real_execute(*command, **kwargs)
    monkeypatch.setattr(rollback.processutils, 'execute', execute)
    code, disks, _ = node.run_json(capsys, '--apply')
    assert {'rewritten', 'on_base'} <= {d['state'] for d in disks.values()}
    assert commands
    for command, limits in commands:
        qemu_img = command[command.index('qemu-img'):]
        assert qemu_img[1] in ('info', 'rebase'), qemu_img
        assert '-f' in qemu_img and qemu_img[qemu_img.index('-f') + 1] == 'qcow2', qemu_img
        assert limits == rollback.QEMU_IMG_LIMITS
        assert limits.address_space == 1 << 30 and limits.cpu_time == 30


def test_bad_arguments(tmp_path, capsys):
    code = rollback.main(['--instances-path', str(tmp_path / 'nowhere')])
    err = capsys.readouterr().err
    assert code == 2
    assert err == 'yolo-rollback: %s is not a directory (--instances-path)\n' % (
        tmp_path / 'nowhere')
    with pytest.raises(SystemExit) as exit_:
        rollback.main(['--apply', '--dry-run'])
    assert exit_.value.code == 2
    assert 'not allowed with argument' in capsys.readouterr().err
