"""The all-in-one cloud for the end-to-end tests: one per test run, shared by every test.

The session fixture makes a new one (``tools/aio/aio clean``, then ``up``: state a previous run
left behind cannot make a test pass) and the tests use it as its users do, with the
``openstack`` client and clouds.yaml's clouds ``aio-admin`` and ``aio-demo`` (a non-admin user
of another project). Host-side checks
(instance disks, yolofs statistics) read what a compute node's operator would.
"""

import json
import os
import pathlib
import signal
import subprocess
import time

import psutil
import pytest

from yolo_testing import aio
from yolo_testing.wait import wait as wait_until

AIO = aio.AIO
VENV = aio.VENV
CLOUDS_YAML = pathlib.Path('/etc/openstack/clouds.yaml')
INSTANCES = aio.INSTANCES[aio.FIRST_HOST]
BASE_DIR = INSTANCES / '_base'
MOUNT_POINT = aio.MOUNT_POINTS[aio.FIRST_HOST]
CONTROL_SOCKET = aio.CONTROL_SOCKETS[aio.FIRST_HOST]
AIO_LOG_DIR = aio.LOG_DIR
YOLOFS = aio.YOLOFS_BIN
READY_MARKER = 'YOLO-GUEST-READY'
FLAVOR = 'm1.yolo'
RESIZE_FLAVOR = 'm1.yolo-large'
# A TCG boot of the test image takes 25-60 s on this 2-core machine, longer beside another.
BOOT_TIMEOUT = 600
BOOT_IMAGE_TIMEOUT = 900


class OpenStackError(Exception):
    pass


def openstack(cloud, *args, parse=True, check=True, timeout=900):
    """Runs the ``openstack`` client as the given cloud's user; JSON output parsed."""
    command = [str(VENV / 'bin' / 'openstack'), '--os-cloud', cloud, *map(str, args)]
    if parse:
        command += ['-f', 'json']
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, 'OS_CLIENT_CONFIG_FILE': str(CLOUDS_YAML)})
    if check and proc.returncode != 0:
        raise OpenStackError('openstack %s failed (%d): %s' % (
            ' '.join(map(str, args)), proc.returncode, proc.stderr.strip()))
    if not parse or proc.returncode != 0:
        return proc
    return json.loads(proc.stdout) if proc.stdout.strip() else None


def admin(*args, **kwargs):
    return openstack('aio-admin', *args, **kwargs)


def demo(*args, **kwargs):
    return openstack('aio-demo', *args, **kwargs)


def yolofs_ctl(*args):
    proc = subprocess.run([YOLOFS, 'ctl', '--socket', CONTROL_SOCKET, *args],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def kill_yolofs():
    """SIGKILLs yolofs and its keeper (the service's process group: start-stop-daemon made it,
    its leader is gone) and waits until both are gone: the mount is left dead (ENOTCONN) until
    ``aio start-yolofs``."""
    pidfile = aio.YOLOFS_PID_FILE
    keeper = psutil.Process(int(pidfile.read_text()))
    group = [keeper, *keeper.children(recursive=True)]
    os.killpg(os.getpgid(keeper.pid), signal.SIGKILL)

    def gone(process):
        try:
            return process.status() == psutil.STATUS_ZOMBIE   # dead, not yet reaped
        except psutil.NoSuchProcess:
            return True
    wait_until('yolofs and its keeper gone', 30, lambda: all(map(gone, group)))
    pidfile.unlink()


def image_property(image, name):
    return image.get(name, (image.get('properties') or {}).get(name))


def connection(cloud, _connections={}):
    """An SDK connection per cloud, for polling: many cheap requests where the CLI would start
    a Python process each time, which these 2 cores would take from the guests."""
    import openstack
    if cloud not in _connections:
        _connections[cloud] = openstack.connect(cloud=cloud, config_files=[str(CLOUDS_YAML)])
    return _connections[cloud]


def server_status(cloud, server_id):
    return connection(cloud).compute.get_server(server_id).status


def wait_for_status(cloud, server_id, status, timeout=BOOT_TIMEOUT):
    def probe():
        server = connection(cloud).compute.get_server(server_id)
        if server.status == 'ERROR':
            fault = connection('aio-admin').compute.get_server(server_id).fault
            raise AssertionError('server %s went to ERROR: %s\n%s' % (
                server_id, fault, compute_errors(server_id)))
        # Nova shows a server's new status before its task ends (shelve's offload reports
        # SHELVED_OFFLOADED while it still cleans up), and refuses the next action until then.
        return server.status == status and server.task_state is None
    wait_until('server %s %s' % (server_id, status), timeout, probe)


def compute_errors(server_id, lines=60):
    """The compute hosts' logged errors about a server (a failed build's fault names only the
    last retry; the cause is in the log of each host that tried)."""
    found = []
    for log in sorted(AIO_LOG_DIR.glob('nova-compute*.log')):
        with open(log, errors='replace') as f:
            found += ['%s: %s' % (log.name, line.rstrip()) for line in f
                      if server_id in line and (' ERROR ' in line or ' WARNING ' in line)]
    return '\n'.join(found[-lines:])


def console_log(cloud, server_id):
    return connection(cloud).compute.get_server_console_output(server_id)['output']


def wait_for_ready(cloud, server_id, previous='', timeout=BOOT_TIMEOUT):
    """Waits for a boot that reaches the ready marker after the one whose console log was
    ``previous``; returns the new console log. A guest started in a new QEMU process (start,
    hard and soft reboot, rescue, resize, unshelve) gets a new console log; one rebooted inside
    its QEMU process appends to it."""
    def probe():
        log = console_log(cloud, server_id)
        if READY_MARKER not in log:
            return None
        # Boot logs begin alike: only a log that does not carry all of the previous one is new.
        appended = log.startswith(previous)
        if not appended or log.count(READY_MARKER) > previous.count(READY_MARKER):
            return log
        return None
    return wait_until('guest of %s ready' % server_id, timeout, probe, interval=3.0)


def instance_disk(server_id, instances=INSTANCES):
    return instances / server_id / 'disk'


def backing_file(server_id, instances=INSTANCES, attempts=5):
    # Read without the image's lock (-U) while libvirt may be rewriting its header (the pivot
    # off the mount): a read in the middle of that fails, the next one does not.
    for attempt in range(attempts):
        done = subprocess.run(
            ['qemu-img', 'info', '-U', '--output=json', str(instance_disk(server_id, instances))],
            capture_output=True, text=True)
        if done.returncode == 0 or attempt == attempts - 1:
            break
        time.sleep(0.5)
    done.check_returncode()
    info = json.loads(done.stdout)
    return info.get('full-backing-filename') or info.get('backing-filename')


def base_file_name(image_id):
    import hashlib
    return hashlib.sha1(image_id.encode()).hexdigest()


@pytest.fixture(scope='session')
def cloud():
    """A new all-in-one cloud for the test run (the venv is kept, everything else made anew)."""
    if os.geteuid() != 0:
        pytest.fail('the end-to-end tests stand up the all-in-one cloud: run them as root')
    subprocess.run([str(AIO), 'clean'], check=True)
    subprocess.run([str(AIO), 'up'], check=True)
    return 'aio-admin'


def upload_public(name, image_file, *properties):
    """``image_file`` uploaded by the admin as a public qcow2 image, as a plain upload."""
    options = [arg for prop in properties for arg in ('--property', prop)]
    return admin('image', 'create', '--public', '--disk-format', 'qcow2',
                 '--container-format', 'bare', *options, '--file', image_file, name)


def wait_for_boot_image(source):
    """The boot image the worker publishes for ``source`` from its profiling boot: (source,
    boot image id). (While the build runs, the image may link one derived from a related
    image's, which the build's own replaces.)"""
    def linked():
        image = admin('image', 'show', source['id'])
        status = image_property(image, 'yolo_boot_image_status')
        if status in ('failed', 'skipped'):
            raise AssertionError('boot image of %s: %s (%s)' % (
                source['id'], status, image_property(image, 'yolo_boot_image_reason')))
        return image if status == 'ready' and image_property(image, 'yolo_boot_image_id') \
            else None
    image = wait_until('boot image of %s' % source['name'], BOOT_IMAGE_TIMEOUT, linked, 5.0)
    return image, image_property(image, 'yolo_boot_image_id')


@pytest.fixture(scope='session')
def public_image(cloud, tiny_image):
    """The tiny test image, a public image: for the tests of Nova's and Glance's paths."""
    image = upload_public('e2e-public-%d' % os.getpid(), tiny_image)
    yield image
    admin('image', 'delete', image['id'], parse=False, check=False)


def cached_on_the_first_host(source):
    """A host's first boot of an image is Nova's own: the download, then the guest over _base
    while the boot image is fetched (docs/nova-driver.md, rule 1). The tests of boots served
    from boot images start after one: the image's base file and boot image on the first host."""
    name = base_file_name(source['id'])
    server = create_server_on(aio.FIRST_HOST, source['id'], 'e2e-first-boot')
    try:
        wait_for_status('aio-admin', server['id'], 'ACTIVE')
        wait_until('boot image of %s installed on %s' % (source['name'], aio.FIRST_HOST), 300,
                   lambda: name in {b['file'] for b in yolofs_ctl('status')['boot_images']})
    finally:
        delete_server('aio-admin', server['id'])


@pytest.fixture(scope='session')
def published_boot_image(public_image):
    published = wait_for_boot_image(public_image)
    cached_on_the_first_host(public_image)
    return published


@pytest.fixture(scope='session')
def debian_public_image(cloud, debian_image):
    """The Debian test image, a public image whose guests get the QEMU guest agent's channel:
    for tests that run commands inside the guest or learn from its boot times."""
    image = upload_public('e2e-debian-%d' % os.getpid(), debian_image, 'hw_qemu_guest_agent=yes')
    yield image
    admin('image', 'delete', image['id'], parse=False, check=False)


@pytest.fixture(scope='session')
def published_debian_boot_image(debian_public_image):
    published = wait_for_boot_image(debian_public_image)
    cached_on_the_first_host(debian_public_image)
    return published


@pytest.fixture(scope='session')
def machine_to_itself():
    """No other tests run beside: the hosts' loads are the machine's. tools/run-tests runs the
    unit and functional tests beside the e2e tests, and says where they write their status when
    they end (YOLO_TESTS_BESIDE_DONE)."""
    done = os.environ.get('YOLO_TESTS_BESIDE_DONE')
    if done:
        wait_until('the tests beside these to end', 3600, lambda: os.path.exists(done), 10.0)


@pytest.fixture(scope='session')
def second_host(cloud):
    """The second compute host (``aio add-compute``): its own libvirtd, instances directory on a
    block device of its own, yolofs and boot image store, and first boots before the download
    (docs/first-boot.md). Its tests come after those that expect one compute host."""
    subprocess.run([str(AIO), 'add-compute'], check=True)
    hosts = {h['Host'] for h in admin('compute', 'service', 'list', '--service', 'nova-compute')}
    assert hosts == set(aio.HOSTS)
    return aio.SECOND_HOST


def on_its_mount(host, server_id):
    """The guest's disk is backed by its host's own yolofs mount."""
    backing = backing_file(server_id, aio.INSTANCES[host])
    assert backing.startswith(str(aio.MOUNT_POINTS[host]) + '/'), (host, backing)


def create_server_on(host, image_id, name):
    """A server of ``image_id`` the admin creates on compute host ``host``."""
    return admin('server', 'create', '--nic', 'none', '--image', image_id, '--flavor', FLAVOR,
                 '--availability-zone', 'nova:%s' % host, name)


def boot_until_ready(host, image_id, name):
    """Boots ``image_id`` on ``host`` until its guest is ready; the server is deleted."""
    server = create_server_on(host, image_id, name)
    try:
        wait_for_status('aio-admin', server['id'], 'ACTIVE')
        wait_for_ready('aio-admin', server['id'])
    finally:
        delete_server('aio-admin', server['id'])


class LogSince:
    """What the all-in-one's log ``name`` (in AIO_LOG_DIR) says from now on."""

    def __init__(self, name):
        self.path = AIO_LOG_DIR / name
        self.since = os.path.getsize(self.path)

    def read(self):
        return aio.text_since(self.path, self.since)


def create_server(cloud, image_id, name, flavor=FLAVOR, wait=True):
    server = openstack(cloud, 'server', 'create', '--nic', 'none', '--image', image_id,
                       '--flavor', flavor, name)
    if wait:
        wait_for_status(cloud, server['id'], 'ACTIVE')
    return server


def delete_server(cloud, server_id):
    openstack(cloud, 'server', 'delete', '--wait', server_id, parse=False, check=False)


def pytest_collection_modifyitems(items):
    # The second compute host comes after the tests that expect one; tests marked "last" look
    # at what the whole run left behind.
    def rank(item):
        if item.get_closest_marker('last'):
            return 2
        return 1 if item.get_closest_marker('two_hosts') else 0
    items.sort(key=rank)
