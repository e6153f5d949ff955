"""The box a profiling boot's QEMU runs in: nothing worth stealing, nothing reachable.

A profiling boot runs a tenant's image, under TCG by default, which QEMU's security policy says
is no security boundary. The worker's user can read what is worth stealing (the worker's
configuration: a keystone password with the admin role, the RabbitMQ URL; its signing key) and
reach the cloud's services on the host's network. So QEMU runs under bubblewrap, which the
worker's user may run without privileges (it builds unprivileged user namespaces):

* new user, PID, IPC, UTS, cgroup and network namespaces: the network has only its own
  loopback, so keystone, RabbitMQ, MariaDB and glance-api are unreachable, and no other process
  of the worker's user can be seen, signalled or traced;
* a new root, read-only, holding ``/usr`` (QEMU, its firmware and libraries), a private
  ``/proc``, a minimal ``/dev``, read-only (plus ``/dev/kvm`` for the kvm runner), an empty
  ``/tmp`` of TMP_BYTES (memory: unbounded, an escaped QEMU could fill the host's RAM through
  it), the learning mount's directory read-only and the overlay's directory: no ``/etc``, no
  ``/var``, no ``/run``, no home;
* resource limits set before bubblewrap starts, inherited by QEMU: address space (guest memory
  plus QEMU's own: its TCG translation cache is up to 1 GiB), CPU seconds, the size of any file
  it writes (the overlay), its threads' stacks, no core dumps; the worker kills it at the
  window's end.

QEMU adds its own seccomp sandbox inside (worker.SANDBOX).
"""

import os
import resource
import shutil
import subprocess

from yolo_glance import profiling

BWRAP = 'bwrap'
# QEMU's own address space beyond the guest's memory: TCG's translation cache (1 GiB by default
# on 64-bit hosts), its libraries and device models, and its threads' stacks (up to 64 I/O
# threads, each with a stack of STACK_BYTES). With 2 GiB a TCG boot of a Debian image failed to
# create a thread.
QEMU_OVERHEAD_BYTES = 3 << 30
# Threads take their stacks' size from the stack limit: 2 MiB, not 8.
STACK_BYTES = 2 << 20
# The sandbox's /tmp, in memory: QEMU writes nothing there.
TMP_BYTES = 16 << 20


class Sandbox:
    """Runs profiling boots' QEMU under bubblewrap with limits.

    ``memory_mib``: the largest guest memory; ``max_seconds``: the longest boot window;
    ``max_file_bytes``: the largest file QEMU may write (the overlay); ``devices``: host devices
    QEMU may open (``/dev/kvm``).
    """

    def __init__(self, memory_mib, max_seconds, max_file_bytes=4 << 30, devices=()):
        self.memory_bytes = (memory_mib << 20) + QEMU_OVERHEAD_BYTES
        self.cpu_seconds = int(max_seconds) + 120
        self.max_file_bytes = max_file_bytes
        self.devices = tuple(devices)

    def command(self, command, read_only=(), writable=()):
        """``command`` (a list) as bubblewrap runs it, seeing ``read_only`` and ``writable``
        (directories) at their own paths and nothing else of the host but ``/usr``."""
        return self.wrapper(read_only, writable) + list(command)

    def wrapper(self, read_only=(), writable=()):
        """What goes before a command to run it in the sandbox (see :meth:`command`)."""
        args = [BWRAP, '--unshare-all', '--die-with-parent', '--new-session',
                '--ro-bind', '/usr', '/usr',
                '--symlink', 'usr/lib', '/lib', '--symlink', 'usr/lib64', '/lib64',
                '--symlink', 'usr/bin', '/bin', '--symlink', 'usr/sbin', '/sbin',
                '--proc', '/proc', '--dev', '/dev', '--size', str(TMP_BYTES), '--tmpfs', '/tmp']
        for device in self.devices:
            args += ['--dev-bind', device, device]
        # /dev is a tmpfs of bubblewrap's, without a size: no files made there (its devices
        # still open for writing).
        args += ['--remount-ro', '/dev']
        for path in read_only:
            args += ['--ro-bind', str(path), str(path)]
        for path in writable:
            args += ['--bind', str(path), str(path)]
        return args + ['--remount-ro', '/', '--clearenv', '--chdir', '/tmp', '--']

    def set_limits(self):
        """The limits, in the child before bubblewrap starts (a ``preexec_fn``)."""
        for limit, value in ((resource.RLIMIT_AS, self.memory_bytes),
                             (resource.RLIMIT_CPU, self.cpu_seconds),
                             (resource.RLIMIT_FSIZE, self.max_file_bytes),
                             (resource.RLIMIT_STACK, STACK_BYTES),
                             (resource.RLIMIT_CORE, 0)):
            resource.setrlimit(limit, (value, value))

    def check_host(self):
        """Raises profiling.PluginError unless bubblewrap runs here as the worker's user."""
        if shutil.which(BWRAP) is None:
            raise profiling.PluginError(
                'the profiling sandbox needs bubblewrap (%s): install the bubblewrap package'
                % BWRAP)
        probe = subprocess.run(self.command(['/usr/bin/true']), capture_output=True,
                               text=True, timeout=60)
        if probe.returncode != 0:
            raise profiling.PluginError(
                'the profiling sandbox (bubblewrap) does not run as user %d here: %s (it needs '
                'unprivileged user namespaces: kernel.unprivileged_userns_clone=1, '
                'user.max_user_namespaces > 0)' % (os.getuid(), probe.stderr.strip()))
