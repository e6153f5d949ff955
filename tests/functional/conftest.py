# Nova's test environment, before any test module here imports Nova (tests/nova_env.py).
from tests import nova_env  # noqa: F401

import pathlib
import shutil
import socket
import subprocess
import tempfile
import time

import psutil
import pytest


def pytest_collection_modifyitems(items):
    # The machine's libvirtd is the all-in-one's first compute host's: tools/run-tests runs these
    # after the end-to-end tests, not beside them.
    for item in items:
        if 'libvirtd' in getattr(item, 'fixturenames', ()):
            item.add_marker('libvirt')


@pytest.fixture
def libvirtd():
    """A libvirtd (and virtlogd) started for the test, unless one already runs."""
    started = []
    for daemon, ready in (('virtlogd', lambda: listening('/run/libvirt/virtlogd-sock')),
                          ('libvirtd', lambda: subprocess.run(
                              ['virsh', '-c', 'qemu:///system', 'version'],
                              capture_output=True).returncode == 0)):
        if daemon_process(daemon) is None:
            # Another test worker may start it at the same moment: the one that loses the pid
            # file exits, and both wait for the winner to answer.
            if subprocess.run([daemon, '-d']).returncode == 0:
                started.append(daemon)
        deadline = time.monotonic() + 30
        while not ready():
            assert time.monotonic() < deadline, '%s did not answer within 30 s' % daemon
            time.sleep(0.2)
    yield 'qemu:///system'
    # Each stopped (by its pid file: a test may have restarted it) and waited for, so that the
    # next test's start of it does not race its exit.
    for daemon in reversed(started):
        process = daemon_process(daemon)
        if process is None:
            subprocess.run(['pkill', '-x', daemon], check=False)
            continue
        process.terminate()
        psutil.wait_procs([process], timeout=30)


def listening(path):
    with socket.socket(socket.AF_UNIX) as sock:
        return sock.connect_ex(path) == 0


def daemon_process(name):
    """The machine's daemon, by its pid file (pgrep would also find the all-in-one's second
    host's, in namespaces of their own); not a later process given its pid. None if none runs."""
    pidfile = pathlib.Path('/run/%s.pid' % name)
    try:
        process = psutil.Process(int(pidfile.read_text()))
        if process.name() == name and process.create_time() <= pidfile.stat().st_mtime + 2:
            return process
    except (OSError, ValueError, psutil.Error):
        pass
    return None


@pytest.fixture
def world_readable_dir():
    """libvirt runs QEMU as its own user: the instance files must be reachable by it."""
    path = pathlib.Path(tempfile.mkdtemp(prefix='yolo-libvirt-', dir='/var/tmp'))
    path.chmod(0o755)
    yield path
    # A mount a test left inside would keep the directory (mounts stop after this teardown).
    with open('/proc/self/mounts') as mounts:
        inside = [line.split()[1] for line in mounts if line.split()[1].startswith(str(path))]
    for mountpoint in inside:
        subprocess.run(['fusermount3', '-uz', mountpoint], check=False, capture_output=True)
    shutil.rmtree(path)
