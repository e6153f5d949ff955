"""The profiling sandbox (yolo_glance/sandbox.py), run as the worker runs it, by an unprivileged
user, with a probe in QEMU's place that tries what an escaped guest would: read the worker's
credentials, reach the cloud's services, write outside its scratch, see other processes. The
same probe outside the sandbox succeeds at each (so a denial inside is the sandbox's doing).
Profiling boots themselves run in it in tests/functional/test_glance_worker.py."""

import json
import os
import pathlib
import pwd
import shutil
import socket
import subprocess
import tempfile

import pytest

from yolo_glance import sandbox as sandbox_mod

USER = 'nobody'
# What the worker's user can read on a Glance node, and the cloud's services' ports.
CREDENTIALS = ['/etc/yolo/yolo-glance-worker.conf', '/etc/yolo/boot-image-signing.key',
               '/etc/glance/glance-api.conf', '/etc/nova/nova.conf',
               '/etc/keystone/keystone.conf', '/etc/passwd']
SERVICE_PORTS = [5000, 5672, 3306, 9292, 8774, 8778, 9311, 11211]

PROBE = r'''
import json, os, socket, sys
args = json.loads(sys.argv[1])
found = {'read': [], 'connected': [], 'wrote': [], 'signalled': [], 'limits': {}}
for path in args['files']:
    try:
        with open(path, 'rb') as f:
            f.read(1)
        found['read'].append(path)
    except OSError:
        pass
for port in args['ports']:
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect(('127.0.0.1', port))
        found['connected'].append(port)
    except OSError:
        pass
    finally:
        s.close()
for path in args['sockets']:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        found['connected'].append(path)
    except OSError:
        pass
    finally:
        s.close()
for path in args['writes']:
    try:
        with open(path, 'w') as f:
            f.write('x')
        found['wrote'].append(path)
    except OSError:
        pass
for pid in args['pids']:
    try:
        os.kill(pid, 0)
        found['signalled'].append(pid)
    except OSError:
        pass
try:
    with open('/proc/self/limits') as f:
        for line in f:
            if line.startswith(('Max file size', 'Max address space', 'Max cpu time',
                                'Max stack size')):
                found['limits'][line[:26].strip()] = line[26:47].strip()
except OSError:
    pass
# /tmp filled with files each under the file size limit, up to twice what it may hold.
if args['fill_tmp']:
    found['tmp_bytes'] = 0
    try:
        for i in range(2 * args['tmp_bytes'] // (args['max_file_bytes'] - 1) + 1):
            with open('/tmp/fill%d' % i, 'wb') as f:
                f.write(bytes(args['max_file_bytes'] - 1))
            found['tmp_bytes'] += args['max_file_bytes'] - 1
    except OSError as e:
        found['tmp_full'] = e.strerror
big = os.path.join(args['writable'], 'big')
try:
    with open(big, 'wb') as f:
        f.write(bytes(args['max_file_bytes'] + 1))
    found['wrote'].append(big)
except OSError as e:
    found['too_big'] = e.strerror
print(json.dumps(found))
'''


@pytest.fixture
def layout():
    """The scratch directories of one boot, owned by the unprivileged user, and a secret and
    services of the host that user can reach outside the sandbox (in a directory it can reach:
    pytest's own are root's only)."""
    user = pwd.getpwnam(USER)
    tmp_path = pathlib.Path(tempfile.mkdtemp(prefix='yolo-sandbox-test.', dir='/var/tmp'))
    tmp_path.chmod(0o755)
    read_only, writable = tmp_path / 'mnt', tmp_path / 'guest'
    for path in (read_only, writable):
        path.mkdir()
        os.chown(path, user.pw_uid, user.pw_gid)
    secret = tmp_path / 'worker-credentials.conf'
    secret.write_text('password = secret\n')
    secret.chmod(0o644)
    listener = socket.create_server(('127.0.0.1', 0))
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(tmp_path / 'service.sock'))
    unix.listen()
    (tmp_path / 'service.sock').chmod(0o777)
    # Another process of the same user (the worker's learning yolofs, say).
    neighbour = subprocess.Popen(['sleep', '300'], user=USER)
    yield {'read_only': read_only, 'writable': writable, 'secret': secret,
           'port': listener.getsockname()[1], 'socket': tmp_path / 'service.sock',
           'neighbour': neighbour.pid}
    neighbour.kill()
    neighbour.wait()
    listener.close()
    unix.close()
    shutil.rmtree(tmp_path)


def probe(layout, sandbox, inside):
    """What the probe could do as the unprivileged user, in ``sandbox`` or (``inside`` False)
    without it."""
    args = {'files': CREDENTIALS + [str(layout['secret'])],
            'ports': SERVICE_PORTS + [layout['port']], 'sockets': [str(layout['socket'])],
            'writes': ['/x', '/usr/x', '/etc/x', '/dev/x', str(layout['read_only'] / 'x'),
                       str(layout['writable'] / 'x')],
            'pids': [layout['neighbour']], 'writable': str(layout['writable']),
            'max_file_bytes': sandbox.max_file_bytes, 'fill_tmp': inside,
            'tmp_bytes': sandbox_mod.TMP_BYTES}
    command = ['/usr/bin/python3', '-c', PROBE, json.dumps(args)]
    if inside:
        command = sandbox.command(command, read_only=[layout['read_only']],
                                  writable=[layout['writable']])
    done = subprocess.run(command, user=USER, group=pwd.getpwnam(USER).pw_gid, extra_groups=[],
                          preexec_fn=sandbox.set_limits if inside else None,
                          capture_output=True, text=True, timeout=120, cwd='/')
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def sandbox():
    return sandbox_mod.Sandbox(memory_mib=256, max_seconds=60, max_file_bytes=1 << 20)


def test_outside_the_sandbox_the_probe_reaches_what_it_tries(layout, sandbox):
    found = probe(layout, sandbox, inside=False)
    assert str(layout['secret']) in found['read'] and '/etc/passwd' in found['read']
    assert layout['port'] in found['connected'] and str(layout['socket']) in found['connected']
    assert str(layout['read_only'] / 'x') in found['wrote']
    assert found['signalled'] == [layout['neighbour']]
    assert 'too_big' not in found


def test_in_the_sandbox_nothing_worth_stealing_and_nothing_reachable(layout, sandbox):
    sandbox.check_host()
    found = probe(layout, sandbox, inside=True)
    # No credential is visible, no service reachable, by TCP or by a socket file.
    assert found['read'] == []
    assert found['connected'] == []
    # Writes land in the overlay's directory only (the read-only bind, /usr and the rest of
    # the tree refuse them).
    assert found['wrote'] == [str(layout['writable'] / 'x')]
    assert not (layout['read_only'] / 'x').exists()
    # The user's other processes cannot be seen or signalled (a PID namespace of its own).
    assert found['signalled'] == []
    # The limits hold inside: a file past the limit is refused, /tmp (memory) fills up.
    assert found['too_big'] == 'File too large'
    assert found['tmp_full'] == 'No space left on device'
    assert found['tmp_bytes'] <= sandbox_mod.TMP_BYTES
    assert found['limits'] == {'Max cpu time': '%d' % sandbox.cpu_seconds,
                               'Max file size': '%d' % sandbox.max_file_bytes,
                               'Max stack size': '%d' % sandbox_mod.STACK_BYTES,
                               'Max address space': '%d' % sandbox.memory_bytes}


def test_a_host_without_bubblewrap_is_refused_at_start(sandbox, monkeypatch):
    monkeypatch.setattr(sandbox_mod, 'BWRAP', '/nonexistent/bwrap')
    with pytest.raises(sandbox_mod.profiling.PluginError, match='needs bubblewrap'):
        sandbox.check_host()
