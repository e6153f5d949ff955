"""Booting real guests with QEMU and timing them.

Boot time is measured as the thesis does: from QEMU's start until the guest reports that sshd has
started. The test image prints a marker on its serial console for that (see
``tools/build-test-image.sh``); any other readiness pattern can be given. TCG is the default
accelerator: KVM guests hang on the machines this project is developed on.
"""

import os
import subprocess
import threading
import time

READY_MARKER = b'YOLO-GUEST-READY'
QEMU = os.environ.get('YOLO_QEMU', 'qemu-system-x86_64')
CONSOLE_LOG_LIMIT = 16 << 20   # bytes of a guest's console kept in its log file


class GuestFailed(Exception):
    """A guest that did not do what was asked of it. The message says what its console showed
    (the image's owner may read it); ``qemu_stderr``, what QEMU or its sandbox said, is for
    logs only: it names the host's paths."""

    def __init__(self, message, qemu_stderr=''):
        super().__init__(message)
        self.qemu_stderr = qemu_stderr


class BootTimeout(GuestFailed):
    """The guest did not become ready in time."""


class Guest:
    """One QEMU process booting ``disk``; its serial console is watched for ``ready_marker``
    (bytes, or a compiled bytes regular expression).

    ``preexec_fn`` runs in the child before QEMU starts (to join a cgroup, say). ``network``
    False gives the guest no network device at all. ``wrapper``: the command QEMU's runs under
    (a sandbox's, say), its arguments first.
    """

    def __init__(self, disk, *, disk_format='qcow2', cache='none',
                 memory_mib=512, cpus=1, accel='tcg',
                 ready_marker=READY_MARKER, console_log=None, extra_args=(),
                 preexec_fn=None, network=True, wrapper=()):
        self.disk = str(disk)
        self.preexec_fn = preexec_fn
        self.ready_marker = ready_marker
        self.console_log = console_log
        self.command = [
            *wrapper, QEMU, '-accel', accel, '-m', str(memory_mib), '-smp', str(cpus),
            '-display', 'none', '-monitor', 'none', '-serial', 'stdio',
            '-no-reboot',
            '-drive', 'file=%s,format=%s,if=virtio,cache=%s' % (
                self.disk, disk_format, cache),
            '-nic', 'user,model=virtio-net-pci' if network else 'none',
            *extra_args,
        ]
        self.process = None
        self.started = None
        self.ready_at = None
        self.vcpu_at_ready = None
        self.cpu_at_ready = None
        self._console = bytearray()
        self._stderr = bytearray()
        self._ready = threading.Event()
        self._reader = None
        self._stderr_reader = None

    def start(self):
        self.started = time.monotonic()
        # In a session of its own: a signal to its caller's process group (oslo.service's
        # SIGHUP to the worker) is not for the guest. Its console (stdout) is the guest's own;
        # QEMU's messages (stderr) are kept apart.
        self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        preexec_fn=self.preexec_fn, start_new_session=True)
        self._reader = threading.Thread(target=self._read_console, daemon=True)
        self._reader.start()
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_reader.start()
        return self

    def _read_stderr(self):
        while chunk := self.process.stderr.read1(65536):
            self._stderr += chunk
            del self._stderr[:-4096]

    def _read_console(self):
        log = open(self.console_log, 'wb') if self.console_log else None
        # A guest (an untrusted image, in the worker) may print without end: the log file keeps
        # its first CONSOLE_LOG_LIMIT bytes.
        room = CONSOLE_LOG_LIMIT
        try:
            while True:
                chunk = self.process.stdout.read1(65536)
                if not chunk:
                    break
                if log and room > 0:
                    log.write(chunk[:room])
                    room -= len(chunk)
                    if room <= 0:
                        log.write(b'\n[console log truncated]\n')
                    log.flush()
                # Keep a window large enough to find a marker split across chunks.
                self._console += chunk
                if not self._ready.is_set() and self._marker_seen():
                    self.ready_at = time.monotonic()
                    self.vcpu_at_ready = self.vcpu_times()
                    self.cpu_at_ready = self.cpu_seconds()
                    self._ready.set()
                if len(self._console) > 1 << 20:
                    del self._console[:-4096]
        finally:
            if log:
                log.close()

    def _marker_seen(self):
        if hasattr(self.ready_marker, 'search'):     # a compiled pattern (re or re2)
            return self.ready_marker.search(self._console) is not None
        return self.ready_marker in self._console

    @property
    def ready(self):
        return self._ready.is_set()

    def wait_ready(self, timeout=600):
        """Waits for the marker; returns the boot time in seconds."""
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.2):
            if self.process.poll() is not None:
                self._reader.join(5)
                if self._ready.is_set():
                    break
                raise BootTimeout('QEMU exited with %d before the guest was ready; '
                                  'console tail: %r' % (self.process.returncode,
                                                        self.console_tail()),
                                  self.stderr_tail())
            if time.monotonic() > deadline:
                raise BootTimeout('guest not ready after %ss; console tail: %r' % (
                    timeout, self.console_tail()), self.stderr_tail())
        return self.ready_at - self.started

    def cpu_seconds(self):
        """CPU time QEMU has used so far (user + system, all threads), from /proc."""
        try:
            with open('/proc/%d/stat' % self.process.pid) as f:
                fields = f.read().rsplit(')', 1)[1].split()
        except OSError:
            return 0.0
        ticks = os.sysconf('SC_CLK_TCK')
        return (int(fields[11]) + int(fields[12])) / ticks

    def vcpu_times(self):
        """(seconds running, seconds waiting for a CPU) of QEMU's busiest thread.

        Under TCG that is the vCPU thread: boot time minus both is the time it was blocked, the
        guest halted waiting for its disk (or a timer). From /proc/PID/task/TID/schedstat.
        """
        busiest = (0, 0)
        try:
            for tid in os.listdir('/proc/%d/task' % self.process.pid):
                with open('/proc/%d/task/%s/schedstat' % (self.process.pid, tid)) as f:
                    run_ns, wait_ns = map(int, f.read().split()[:2])
                busiest = max(busiest, (run_ns, wait_ns))
        except OSError:
            pass  # QEMU exited, or a thread ended while listed
        return busiest[0] / 1e9, busiest[1] / 1e9

    def console_tail(self, size=800):
        return bytes(self._console[-size:]).decode(errors='replace')

    def stderr_tail(self):
        """The last of what QEMU (or the command it runs under) wrote to its stderr."""
        if self._stderr_reader and self.process.poll() is not None:
            self._stderr_reader.join(5)
        return bytes(self._stderr).decode(errors='replace').strip()

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for reader in (self._reader, self._stderr_reader):
            if reader:
                reader.join(5)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def boot(disk, timeout=600, **options):
    """Boots ``disk`` until ready, stops the guest, returns the boot time in seconds."""
    with Guest(disk, **options) as guest:
        return guest.wait_ready(timeout)


def drop_caches():
    """Empties the page cache (cold-cache runs, as the thesis did)."""
    os.sync()
    with open('/proc/sys/vm/drop_caches', 'w') as f:
        f.write('3\n')


def libvirt_domain_xml(name, disk, console_log, uuid=None):
    """A libvirt domain booting the qcow2 ``disk`` as Nova's guests do (virtio, ``cache=none``,
    TCG), its serial console written to ``console_log``, with the channel of a QEMU guest agent
    (as Nova gives images with ``hw_qemu_guest_agent=yes``)."""
    uuid_element = '<uuid>%s</uuid>' % uuid if uuid else ''
    return f"""<domain type='qemu'>
  <name>{name}</name>{uuid_element}
  <memory unit='MiB'>512</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>
  <features><acpi/></features>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' cache='none' io='native'/>
      <source file='{disk}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <serial type='file'><source path='{console_log}'/><target port='0'/></serial>
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
  </devices>
</domain>"""
