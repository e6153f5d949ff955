"""Boot images enter a real yolofs' store only through its control socket, and only verified.

A real mount, real boot images (``yolofs build``), the driver's :class:`BootImages` with Glance
faked; no guest is booted. Also: who may talk to the control socket (its group and mode), and
what an unprivileged client may hand in.
"""

import errno
import grp
import json
import os
import pathlib
import pwd
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from tests.functional.test_nova_driver_fakelibvirt import downloads_left
from tests.functional.test_nova_driver_fakelibvirt import FakeImageAPI
from yolo_common import contract
from yolo_common import images
from yolo_common import signing
from yolo_common import yolofs
from yolo_nova.virt import backing
from yolo_nova.virt import boot_images

SIZE = 8 << 20
IMAGE_ID = 'c0ffee00-0000-4000-8000-00000000000a'
NAME = images.base_file_name(IMAGE_ID)
READS = '0 65536\n1048576 8192\n5000000 300000\n'

root_only = pytest.mark.skipif(os.geteuid() != 0, reason='needs root (other users, groups)')


def stored_as(stored, boot_image):
    """Whether the store's boot image ``stored`` is ``boot_image``: the store keeps boot images
    packed (their blocks in its block file), so their header and index are compared, which
    name every extent and its data's CRC."""
    def inspect(path):
        answer = json.loads(yolofs.run('inspect', '--json', path).stdout)
        return {k: v for k, v in answer.items() if k not in ('path', 'packed')}, answer['packed']
    (stored, packed), (published, _) = inspect(stored), inspect(boot_image)
    return packed and stored == published


def build(tmp_path, source, output, image_id=IMAGE_ID, reads=READS):
    trace = tmp_path / 'trace'
    trace.write_text(reads)
    args = ['build', '--trace', trace, '--source', source, '--output', output]
    if image_id:
        args += ['--image-id', image_id]
    yolofs.run(*args)
    return output


@pytest.fixture
def host(tmp_path, mount_factory):
    """A compute host: a base file in _base, a yolofs mount of it, nova's download dir."""
    base_dir = tmp_path / '_base'
    base_dir.mkdir()
    (base_dir / NAME).write_bytes(random.Random(3).randbytes(SIZE))
    store = tmp_path / 'boot-images'
    mount = mount_factory(base_dir, boot_images=store)
    files = backing.BackingFiles(base_dir, mount.mountpoint, mount.control_socket, 5.0)
    glance = FakeImageAPI()
    glance.images[IMAGE_ID] = {'properties': {}}
    driver_side = boot_images.BootImages(files, tmp_path / 'downloads', image_api=glance,
                                         boot_image_api=glance)
    return base_dir, store, mount, glance, driver_side


def publish(tmp_path, glance, source, image_id=IMAGE_ID, signer=None, reads=READS,
            boot_image_id='boot-image'):
    """Publishes a boot image of ``source`` for IMAGE_ID, as the worker with ``signer``'s key
    does (None: unsigned)."""
    published = build(tmp_path, source, tmp_path / ('published-%s.yolo' % uuid.uuid4().hex),
                      image_id=image_id, reads=reads)
    digest = signing.file_digest(published, 'sha512')
    properties = {'yolo_source_image_id': IMAGE_ID}
    if signer is not None:
        properties[contract.SIGNATURE] = signer.sign(IMAGE_ID, 'sha512', digest)
    glance.images[boot_image_id] = {'properties': properties, 'file': published,
                                    'os_hash_algo': 'sha512', 'os_hash_value': digest}
    glance.images[IMAGE_ID] = {'properties': {'yolo_boot_image_id': boot_image_id}}


def test_a_published_boot_image_is_installed_by_yolofs_and_served(host, tmp_path):
    base_dir, store, mount, glance, driver_side = host
    publish(tmp_path, glance, base_dir / NAME)
    assert driver_side.ensure(None, IMAGE_ID, str(base_dir / NAME)) == 'installed'
    # Installed and stamped by yolofs; nova's download is gone.
    assert sorted(p.name for p in store.iterdir() if not p.name.startswith('.')) == [
        NAME + '.image-id', NAME + '.yolo', NAME + '.yolo.verified', 'blocks.pack']
    assert downloads_left(tmp_path / 'downloads') == []
    status = mount.client.status()
    assert status.boot_images[NAME] == yolofs.BootImage(
        file=NAME, image_id=IMAGE_ID, verified=True, rejected=None, learned=False)
    assert driver_side.verified_image_ids() == {IMAGE_ID}
    assert driver_side.ensure(None, IMAGE_ID, str(base_dir / NAME)) == 'present'
    # The next open reads from it.
    data = (base_dir / NAME).read_bytes()
    with open(mount.mountpoint / NAME, 'rb') as f:
        f.seek(1048576)
        assert f.read(8192) == data[1048576:1048576 + 8192]
    assert mount.client.stats(NAME)[NAME]['bytes_memory'] > 0


def test_a_newer_version_takes_the_place_of_the_one_installed(host, tmp_path):
    """A fleet merge publishes version 2 and links it from the image: a host that holds
    version 1 installs it at a boot after its next version check, from a thread, its guests
    booting from version 1 meanwhile."""
    base_dir, store, mount, glance, driver_side = host
    base = str(base_dir / NAME)
    now = [1000.0]
    driver_side.clock = lambda: now[0]
    publish(tmp_path, glance, base_dir / NAME)
    assert driver_side.ensure(None, IMAGE_ID, base) == 'installed'
    assert driver_side.installed_id(NAME) == 'boot-image'
    publish(tmp_path, glance, base_dir / NAME, boot_image_id='version-2',
            reads=READS + '6000000 8192\n')
    # Checked at most once per interval: not yet.
    assert driver_side.ensure(None, IMAGE_ID, base) == 'present'
    assert glance.downloads == ['boot-image']
    now[0] += driver_side.version_check_interval
    assert driver_side.ensure(None, IMAGE_ID, base) == 'present'
    # Disks are not held on _base while it comes.
    assert driver_side.fetching(NAME) is None
    wait_until = time.monotonic() + 30
    while driver_side.installed_id(NAME) != 'version-2' and time.monotonic() < wait_until:
        time.sleep(0.1)
    assert driver_side.installed_id(NAME) == 'version-2'
    assert stored_as(store / (NAME + '.yolo'), glance.images['version-2']['file'])
    # The next check finds it current: nothing fetched again.
    now[0] += driver_side.version_check_interval
    assert driver_side.ensure(None, IMAGE_ID, base) == 'present'
    wait_until = time.monotonic() + 30
    while driver_side._moving and time.monotonic() < wait_until:
        time.sleep(0.1)
    assert not driver_side._moving
    assert glance.downloads == ['boot-image', 'version-2']
    # Glance away at a check: the installed one is used, as it is.
    now[0] += driver_side.version_check_interval
    glance.images.clear()
    assert driver_side.ensure(None, IMAGE_ID, base) == 'present'


def test_a_boot_image_of_other_bytes_is_refused_by_yolofs(host, tmp_path, caplog):
    base_dir, store, mount, glance, driver_side = host
    other = tmp_path / 'other.raw'
    other.write_bytes(random.Random(4).randbytes(SIZE))
    publish(tmp_path, glance, other)
    assert driver_side.ensure(None, IMAGE_ID, str(base_dir / NAME)) == 'rejected'
    assert 'does not match base file %s' % NAME in caplog.text
    assert not (store / (NAME + '.yolo')).exists()
    assert downloads_left(tmp_path / 'downloads') == []
    assert NAME not in mount.client.status().boot_images


def test_a_boot_image_of_another_image_is_refused_by_yolofs(host, tmp_path, caplog):
    base_dir, store, mount, glance, driver_side = host
    publish(tmp_path, glance, base_dir / NAME, image_id='another-image')
    assert driver_side.ensure(None, IMAGE_ID, str(base_dir / NAME)) == 'rejected'
    assert 'is for image another-image, not %s' % IMAGE_ID in caplog.text
    assert not (store / (NAME + '.yolo')).exists()


@pytest.fixture
def signed_host(host, tmp_path):
    """The host, its driver given the worker's public key; and the worker's key."""
    base_dir, store, mount, glance, driver_side = host
    worker_key = signing.Signer.generate()
    driver_side = boot_images.BootImages(
        driver_side.backing_files, tmp_path / 'downloads', image_api=glance,
        boot_image_api=glance, signing_keys=[signing.Signer.generate().public_key,
                                             worker_key.public_key])
    return (base_dir, store, mount, glance, driver_side), worker_key


def test_with_the_workers_keys_a_boot_image_it_signed_is_installed(signed_host, tmp_path):
    (base_dir, store, mount, glance, driver_side), worker_key = signed_host
    publish(tmp_path, glance, base_dir / NAME, signer=worker_key)
    assert driver_side.ensure(None, IMAGE_ID, str(base_dir / NAME)) == 'installed'


@pytest.mark.parametrize('who', ['nobody', 'another key', 'other bytes', 'another image'])
def test_with_the_workers_keys_a_boot_image_it_did_not_sign_is_refused(
        signed_host, tmp_path, caplog, who):
    (base_dir, store, mount, glance, driver_side), worker_key = signed_host
    signer = {'nobody': None, 'another key': signing.Signer.generate()}.get(who, worker_key)
    publish(tmp_path, glance, base_dir / NAME, signer=signer)
    boot_image = glance.images['boot-image']
    if who == 'other bytes':
        # The boot image's file replaced in Glance's store after it was signed.
        boot_image['file'] = build(tmp_path, base_dir / NAME, tmp_path / 'replaced.yolo',
                                   image_id='c0ffee00-0000-4000-8000-00000000000b')
    elif who == 'another image':
        # Signed for another image, and relabelled as this one's.
        boot_image['properties'][contract.SIGNATURE] = worker_key.sign(
            'another-image', 'sha512', boot_image['os_hash_value'])
    assert driver_side.ensure(None, IMAGE_ID, str(base_dir / NAME)) == 'rejected'
    expected = ("not signed with the worker's key" if who == 'nobody'
                else "its signature is not the worker's over the bytes downloaded")
    assert expected in caplog.text
    # Unsigned: not even downloaded. Either way nothing is left, or installed, or fetched again.
    assert glance.downloads == ([] if who == 'nobody' else ['boot-image'])
    assert not list((tmp_path / 'downloads').glob('*'))
    assert not (store / (NAME + '.yolo')).exists()
    assert driver_side.ensure(None, IMAGE_ID, str(base_dir / NAME)) == 'rejected'
    assert len(glance.downloads) <= 1


def test_a_boot_image_a_host_rejected_is_used_by_no_host(signed_host, tmp_path, caplog):
    (base_dir, store, mount, glance, driver_side), worker_key = signed_host
    publish(tmp_path, glance, base_dir / NAME, signer=worker_key)
    driver_side.reject(IMAGE_ID, 'boot-image', 'did not match')
    assert 'did not match' in glance.images['boot-image']['properties'][contract.REJECTED]
    other_host = boot_images.BootImages(
        driver_side.backing_files, tmp_path / 'downloads', image_api=glance,
        boot_image_api=glance, signing_keys=[worker_key.public_key])
    assert other_host.ensure(None, IMAGE_ID, str(base_dir / NAME)) == 'rejected'
    assert 'rejected by a compute host' in caplog.text
    assert glance.downloads == []


def test_nothing_is_attempted_while_yolofs_is_down(host, tmp_path):
    base_dir, store, mount, glance, driver_side = host
    publish(tmp_path, glance, base_dir / NAME)
    mount.stop()
    assert driver_side.ensure(None, IMAGE_ID, str(base_dir / NAME)) == 'unavailable'
    assert glance.downloads == []
    assert driver_side.verified_image_ids() == set()
    assert driver_side.prune() == []


def test_ctl_install_symlinks_size_bound_and_prune(tmp_path, mount_factory):
    base_dir = tmp_path / '_base'
    base_dir.mkdir()
    (base_dir / NAME).write_bytes(random.Random(3).randbytes(SIZE))
    store = tmp_path / 'boot-images'
    mount = mount_factory(base_dir, boot_images=store, max_boot_image_bytes=1 << 20)
    candidate = build(tmp_path, base_dir / NAME, tmp_path / 'candidate.yolo')
    socket_args = ('ctl', '--socket', mount.control_socket)

    link = tmp_path / 'link.yolo'
    link.symlink_to(candidate)
    proc = yolofs.run(*socket_args, 'install', NAME, link, IMAGE_ID, check=False)
    assert proc.returncode != 0 and 'symbolic link' in proc.stderr, proc.stderr
    big = tmp_path / 'big.yolo'
    big.write_bytes(b'\0' * ((1 << 20) + 1))
    proc = yolofs.run(*socket_args, 'install', NAME, big, IMAGE_ID, check=False)
    assert 'more than the 1048576-byte limit' in proc.stderr, proc.stderr
    proc = yolofs.run(*socket_args, 'install', '../' + NAME, candidate, IMAGE_ID, check=False)
    assert 'invalid base file name' in proc.stderr, proc.stderr

    # A relative path is resolved by the client, not by the daemon.
    answer = json.loads(subprocess.run(
        [yolofs.binary(), *map(str, socket_args), 'install', NAME, candidate.name, IMAGE_ID],
        cwd=tmp_path, check=True, capture_output=True, text=True).stdout)
    assert answer['installed']['file'] == NAME and answer['installed']['extents'] > 0
    assert stored_as(store / (NAME + '.yolo'), candidate)

    # The image cache manager removes the base file: yolofs prunes what went with it.
    (base_dir / NAME).unlink()
    assert mount.client.prune() == [NAME + '.image-id', NAME + '.yolo', NAME + '.yolo.verified']
    assert mount.client.status().boot_images == {}


def test_a_learned_boot_image_names_the_image_nova_remembered(tmp_path, mount_factory):
    base_dir = tmp_path / '_base'
    base_dir.mkdir()
    data = random.Random(3).randbytes(SIZE)
    (base_dir / NAME).write_bytes(data)
    mount = mount_factory(base_dir, learn=True, record_idle_secs=600, no_keep_cache=True)
    mount.client.remember(NAME, IMAGE_ID)
    with open(mount.mountpoint / NAME, 'rb') as f:
        assert f.read(65536) == data[:65536]
    assert mount.client.record_stop(NAME)['built'] is True
    assert mount.client.status().boot_images[NAME] == yolofs.BootImage(
        file=NAME, image_id=IMAGE_ID, verified=True, rejected=None, learned=True)
    learned = tmp_path / 'boot-images' / (NAME + '.yolo')
    info = json.loads(yolofs.run('inspect', '--json', learned).stdout)
    assert info['identity']['image_id'] == IMAGE_ID


def test_a_published_boot_image_replaces_one_learned_here(tmp_path, mount_factory):
    # A boot that failed early (or ran while Glance was away) left a boot image of a few reads;
    # the one Glance publishes, from a whole boot, takes its place at the next boot.
    base_dir = tmp_path / '_base'
    base_dir.mkdir()
    data = random.Random(3).randbytes(SIZE)
    (base_dir / NAME).write_bytes(data)
    store = tmp_path / 'boot-images'
    mount = mount_factory(base_dir, boot_images=store, learn=True, record_idle_secs=600,
                          no_keep_cache=True)
    mount.client.remember(NAME, IMAGE_ID)
    with open(mount.mountpoint / NAME, 'rb') as f:
        f.read(4096)
    assert mount.client.record_stop(NAME)['built'] is True
    files = backing.BackingFiles(base_dir, mount.mountpoint, mount.control_socket, 5.0)
    glance = FakeImageAPI()
    glance.images[IMAGE_ID] = {'properties': {}}
    driver_side = boot_images.BootImages(files, tmp_path / 'downloads', image_api=glance,
                                         boot_image_api=glance)
    # Nothing published: the learned one is used.
    assert driver_side.ensure(None, IMAGE_ID, str(base_dir / NAME)) == 'present'
    publish(tmp_path, glance, base_dir / NAME)
    assert driver_side.ensure(None, IMAGE_ID, str(base_dir / NAME)) == 'installed'
    assert stored_as(store / (NAME + '.yolo'), glance.images['boot-image']['file'])
    assert not (store / (NAME + '.trace')).exists()
    assert mount.client.status().boot_images[NAME].learned is False
    # Installed: the next boot does not ask Glance again.
    glance.images.clear()
    assert driver_side.ensure(None, IMAGE_ID, str(base_dir / NAME)) == 'present'


CLIENT = '''
import json, socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    sock.connect(sys.argv[1])
except PermissionError:
    sys.exit(13)
sock.sendall(sys.argv[2].encode() + b'\\n')
print(sock.makefile().readline(), end='')
'''


def client_as(user, socket_path, request, extra_groups=()):
    """Sends one request as ``user`` (its own group, and ``extra_groups``, only): (exit code,
    answer or None); exit code EACCES if it may not connect."""
    python = '/usr/bin/python3' if os.path.exists('/usr/bin/python3') else sys.executable
    proc = subprocess.run([python, '-I', '-c', CLIENT, str(socket_path), json.dumps(request)],
                          user=user, group=pwd.getpwnam(user).pw_gid,
                          extra_groups=list(extra_groups), cwd='/', capture_output=True,
                          text=True, timeout=60)
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None


@pytest.fixture
def throwaway_group():
    name = 'yolotest%s' % uuid.uuid4().hex[:8]
    subprocess.run(['groupadd', '--system', name], check=True)
    try:
        yield name, grp.getgrnam(name).gr_gid
    finally:
        subprocess.run(['groupdel', name], check=False)


@pytest.fixture
def public_dir():
    """A directory every user can traverse (pytest's tmp_path is root's only)."""
    path = pathlib.Path(tempfile.mkdtemp(prefix='yolofs-socket-'))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@root_only
def test_only_the_socket_group_may_talk_to_yolofs(tmp_path, public_dir, throwaway_group):
    group, gid = throwaway_group
    base_dir = tmp_path / '_base'
    base_dir.mkdir()
    socket_path = public_dir / 'run' / 'control.sock'
    mount = yolofs.Mount(base_dir, tmp_path / 'mnt', tmp_path / 'boot-images', socket_path,
                         log_path=tmp_path / 'yolofs.log', control_socket_mode='0660',
                         control_socket_group=group)
    try:
        mount.start()
        st = socket_path.stat()
        assert (oct(st.st_mode & 0o7777), st.st_gid) == (oct(0o660), gid)
        # The missing directory was created, reachable by everyone.
        assert (socket_path.parent.stat().st_mode & 0o7777) == 0o755
        assert sorted(os.listdir(socket_path.parent)) == ['control.sock']

        code, answer = client_as('nobody', socket_path, {'op': 'status'})
        assert (code, answer) == (errno.EACCES, None)
        code, answer = client_as('nobody', socket_path, {'op': 'status'}, extra_groups=[gid])
        assert code == 0 and answer['ok'] is True, answer
    finally:
        mount.stop()


@root_only
def test_an_unprivileged_client_installs_only_its_own_files(tmp_path, public_dir):
    base_dir = tmp_path / '_base'
    base_dir.mkdir()
    (base_dir / NAME).write_bytes(random.Random(3).randbytes(SIZE))
    socket_path = public_dir / 'control.sock'
    mount = yolofs.Mount(base_dir, tmp_path / 'mnt', tmp_path / 'boot-images', socket_path,
                         log_path=tmp_path / 'yolofs.log', control_socket_mode='0666')
    try:
        mount.start()
        candidate = build(tmp_path, base_dir / NAME, public_dir / 'candidate.yolo')
        request = {'op': 'install', 'file': NAME, 'boot_image': str(candidate),
                   'image_id': IMAGE_ID}
        # root's file: yolofs does not read it for nobody.
        code, answer = client_as('nobody', socket_path, request)
        assert answer['ok'] is False and 'not by the requesting user' in answer['error'], answer
        assert not (tmp_path / 'boot-images' / (NAME + '.yolo')).exists()
        os.chown(candidate, pwd.getpwnam('nobody').pw_uid, -1)
        code, answer = client_as('nobody', socket_path, request)
        assert answer['ok'] is True, answer
        assert mount.client.status().boot_images[NAME].verified is True
    finally:
        mount.stop()


def test_preload_and_touch_open_no_link_and_no_fifo(tmp_path, mount_factory):
    """A name in a request is opened as install opens one: a link to a file the client may not
    read is refused before anything of that file is told, and a FIFO blocks no thread."""
    base_dir = tmp_path / '_base'
    base_dir.mkdir()
    secret = tmp_path / 'root-only'
    secret.write_bytes(random.Random(5).randbytes(SIZE))
    secret.chmod(0o600)
    os.utime(secret, ns=(1, 1))
    secret_mtime = secret.stat().st_mtime_ns
    link, fifo = images.base_file_name('link'), images.base_file_name('fifo')
    (base_dir / link).symlink_to(secret)
    os.mkfifo(base_dir / fifo)
    mount = mount_factory(base_dir)
    for op in ('preload', 'touch'):
        with pytest.raises(yolofs.YolofsError, match='is a symbolic link'):
            mount.client.request(op, file=link)
        with pytest.raises(yolofs.YolofsError, match='is not a regular file'):
            mount.client.request(op, file=fifo, timeout=10)
    assert mount.client.status().answer['ok']
    # touch set no time on the file the link names.
    assert secret.stat().st_mtime_ns == secret_mtime


def test_control_clients_are_bounded_in_number_size_and_idleness(tmp_path, mount_factory):
    base_dir = tmp_path / '_base'
    base_dir.mkdir()
    mount = mount_factory(base_dir, control_max_clients=2, control_idle_secs=2)

    def connect():
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(10)
        sock.connect(str(mount.control_socket))
        return sock

    def answer(sock):
        with sock.makefile('rb') as lines:
            line = lines.readline()
            return json.loads(line), lines.read()      # then the end of the connection

    def served():
        """A client that yolofs serves (once the threads of clients gone have ended)."""
        for attempt in range(50):
            sock = connect()
            sock.sendall(b'{"op": "host_load"}\n')
            if json.loads(sock.makefile('rb').readline())['ok']:
                return sock
            sock.close()
            time.sleep(0.1)
        raise AssertionError('yolofs served no client')

    idle = [served(), served()]
    # One client more than the bound is told so and let go.
    refused, rest = answer(connect())
    assert 'serves 2 clients already' in refused['error'] and rest == b''
    # Clients that send nothing are let go after the idle time, which frees their places.
    for sock in idle:
        assert sock.recv(4096) == b''
    assert mount.client.status().answer['ok']
    # A request line longer than the bound is refused and its client let go.
    sock = connect()
    sock.sendall(b'{"op": "status", "x": "' + b'a' * (70 << 10) + b'"}\n')
    refused, rest = answer(sock)
    assert refused['error'] == 'request longer than 65536 bytes' and rest == b''
    assert mount.client.status().answer['ok']
