"""A detach interrupted at each of its steps never loses a guest's write: nova-compute killed
(SIGKILL), the guest then running on or stopped before nova-compute starts again, and libvirtd
restarted. Real libvirtd and QEMU; the guest has no operating system: its writes are made by
QEMU's own block layer (HMP ``qemu-io`` on the guest's disk device), as a guest's would be,
through any block job. Only the moment of each interruption is chosen by the test
(``detach._step``); the faults are real.
"""

import os
import pathlib
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from yolo_common import images
from yolo_common import qemu
from yolo_nova.virt import backing
from yolo_nova.virt import detach

URI = 'qemu:///system'
MiB = 1 << 20
# Every step of a detach, in order (detach._step; the second of a name is the second pivot's).
STEPS = ['interim created', 'copied', 'pivoting', 'pivoted', 'on the interim disk',
         'disk made again', 'copied#2', 'pivoting#2', 'pivoted#2', 'back on the disk',
         'mark removed']
# Written by the guest: before the detach, after its interruption, after nova-compute's start.
BEFORE, AFTER, LATER = (0x11, 0), (0x22, MiB), (0x33, 2 * MiB)

# nova-compute's detach, in a process of its own, killed at one step.
DETACH_KILLED_AT = textwrap.dedent('''
    import os, signal, sys
    import libvirt
    from nova.virt.libvirt import guest as libvirt_guest
    from yolo_nova.virt import detach
    uri, uuid, disk, base, kill_at = sys.argv[1:]
    seen = []
    def step(name):
        seen.append(name)
        count = seen.count(name)
        if (name if count == 1 else '%s#%d' % (name, count)) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    detach._step = step
    def lookup():
        return libvirt_guest.Guest(libvirt.open(uri).lookupByUUIDString(uuid))
    detach.move_backing(lookup, 'vda', disk, base)
''')


class Host:
    """A host's files: ``_base/base``, the same bytes at ``mnt/base`` (standing for the yolofs
    mount), and an instance whose disk is over the mount."""

    def __init__(self, root):
        self.root = root
        self.base = root / '_base' / 'base'
        self.mounted = root / 'mnt' / 'base'
        for path in (self.base, self.mounted):
            path.parent.mkdir()
            with open(path, 'wb') as f:
                f.truncate(16 * MiB)
        self.disk = root / 'instance' / 'disk'
        self.disk.parent.mkdir()
        images.create_overlay(self.mounted, self.disk)
        self.interim = pathlib.Path(str(self.disk) + detach.DETACH_SUFFIX)
        self.files = backing.BackingFiles(self.base.parent, self.mounted.parent,
                                          root / 'control.sock', 1.0)
        self.uuid = str(uuid.uuid4())
        self.name = 'yolo-detach-' + self.uuid[:8]

    def start(self):
        xml = qemu.libvirt_domain_xml(self.name, self.disk, self.root / 'console.log',
                                      uuid=self.uuid)
        (self.root / 'domain.xml').write_text(xml)
        virsh('define', str(self.root / 'domain.xml'))
        virsh('start', self.name)

    def guest(self):
        import libvirt
        from nova.virt.libvirt import guest as libvirt_guest
        try:
            return libvirt_guest.Guest(libvirt.open(URI).lookupByUUIDString(self.uuid))
        except libvirt.libvirtError:
            return None

    def write(self, pattern):
        value, offset = pattern
        # Synchronous; its output goes to QEMU's stdout, not the monitor: read back in the end.
        out = virsh('qemu-monitor-command', self.name, '--hmp',
                    'qemu-io -d /machine/peripheral/virtio-disk0/virtio-backend '
                    '"write -P %d %d 64k"' % (value, offset))
        assert 'rror' not in out, out

    def detacher(self):
        return detach.Detacher(self.files, lambda _: self.guest(), settle_seconds=0,
                               max_seconds=0)

    def nova_compute_starts(self):
        """As the driver's init_host: settle, then finish, what a detach left."""
        guest = self.guest()
        running = guest.is_active()
        on_interim = detach.reconcile(guest.get_xml_desc(), running)
        if running and (on_interim or detach.disks_on_mount(guest.get_xml_desc(), self.files)):
            self.detacher().detach(self.uuid)

    def stop(self):
        virsh('destroy', self.name)

    def assert_holds(self, *patterns):
        """The disk Nova starts the guest from holds every write, over _base."""
        detach.recover(str(self.disk))
        assert images.info(self.disk)['backing-filename'] in (str(self.base), str(self.mounted))
        for value, offset in patterns:
            out = subprocess.run(['qemu-io', '-f', 'qcow2', '-r', '-c',
                                  'read -P %d %d 64k' % (value, offset), str(self.disk)],
                                 capture_output=True, text=True, check=True).stdout
            assert 'read 65536/65536' in out and 'failed' not in out, (value, out)


def virsh(*args):
    return subprocess.run(['virsh', '-c', URI] + list(args), check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture
def host(libvirtd, world_readable_dir):
    host = Host(world_readable_dir)
    yield host
    subprocess.run(['virsh', '-c', URI, 'destroy', host.name], capture_output=True)
    subprocess.run(['virsh', '-c', URI, 'undefine', host.name], capture_output=True)


def leftovers(host):
    return sorted(p.name for p in host.disk.parent.iterdir() if p.name != 'disk')


def kill_detach_at(host, step):
    process = subprocess.run([sys.executable, '-c', DETACH_KILLED_AT, URI, host.uuid,
                              str(host.disk), str(host.base), step],
                             capture_output=True, text=True, timeout=300)
    assert process.returncode == -9, process.stderr[-2000:]


@pytest.mark.parametrize('step', STEPS)
def test_nova_compute_killed_while_the_guest_runs_on(host, step):
    """The guest writes after the kill; nova-compute's start finishes the detach; the guest
    writes again, stops, and starts from a disk over _base that holds all three writes, with
    nothing left beside it."""
    host.start()
    host.write(BEFORE)
    kill_detach_at(host, step)
    host.write(AFTER)
    host.nova_compute_starts()
    host.write(LATER)
    live = host.guest().get_xml_desc()
    assert [path for _, path, _ in detach.qcow2_file_disks(live)] == [str(host.disk)]
    assert images.info(host.disk)['backing-filename'] == str(host.base)
    assert leftovers(host) == []
    host.stop()
    host.assert_holds(BEFORE, AFTER, LATER)


@pytest.mark.parametrize('step', STEPS)
def test_nova_compute_killed_then_the_guest_stops(host, step, caplog):
    """The host goes down with nova-compute: the guest wrote after the kill, then stopped;
    nova-compute's start settles what libvirt's definition says, and the next start finds
    every write. Only where the first pivot was asked for and libvirt's definition still names
    disk (libvirt records a pivot once it took effect: it may or may not have) are both files
    kept, with an alarm."""
    host.start()
    host.write(BEFORE)
    kill_detach_at(host, step)
    host.write(AFTER)
    host.stop()
    host.nova_compute_starts()
    host.assert_holds(BEFORE, AFTER)
    kept = [name for name in leftovers(host) if detach.KEPT_SUFFIX in name]
    assert leftovers(host) == kept
    assert len(kept) == (step == 'pivoting') == ('ALARM' in caplog.text)


def restart_libvirtd():
    pid = int(pathlib.Path('/run/libvirtd.pid').read_text())
    os.kill(pid, 15)
    deadline = time.monotonic() + 30
    while pathlib.Path('/proc/%d' % pid).exists():
        assert time.monotonic() < deadline, 'libvirtd did not stop'
        time.sleep(0.1)
    subprocess.run(['libvirtd', '-d'], check=True)


@pytest.mark.serial
@pytest.mark.parametrize('step', ['interim created', 'copied', 'pivoted', 'copied#2',
                                  'pivoted#2'])
def test_libvirtd_restarted_during_a_detach(host, step, monkeypatch):
    """libvirtd restarts at a step: the detach asks the new libvirtd where the guest is and
    goes on, or stops with the guest where libvirt says; the guest's writes are all kept."""
    seen = []

    def restart_at(name):
        seen.append(name)
        count = seen.count(name)
        if (name if count == 1 else '%s#%d' % (name, count)) == step:
            restart_libvirtd()
    monkeypatch.setattr(detach, '_step', restart_at)
    host.start()
    host.write(BEFORE)
    host.detacher().detach(host.uuid)
    monkeypatch.setattr(detach, '_step', lambda name: None)
    host.write(AFTER)
    # The guest is on disk, or still on the interim disk (a second pivot that did not happen),
    # which nova-compute's next start finishes.
    host.nova_compute_starts()
    live = host.guest().get_xml_desc()
    assert [path for _, path, _ in detach.qcow2_file_disks(live)] == [str(host.disk)]
    assert leftovers(host) == []
    host.stop()
    host.assert_holds(BEFORE, AFTER)
