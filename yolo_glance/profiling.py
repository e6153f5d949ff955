"""The profiling boot's variable parts: plugins loaded by entry point with stevedore.

* ``yolo.profiling.runners`` (``[yolo_profiling] runner``): how the profiling boot's QEMU runs.
  ``tcg`` (QEMU's emulation, the default) and ``kvm``.
* ``yolo.profiling.readiness`` (``[yolo_profiling] readiness``): what ends the boot window before
  ``max_seconds``. ``console`` (the ready pattern on the serial console) and ``idle`` (no read of
  the image for ``idle_seconds``), both by default.

The worker keeps what contains an untrusted guest (no network device, QEMU's seccomp sandbox,
memory and time limits, the bounds on per-image overrides): a runner only names the accelerator
and a few CPU and machine options, which :func:`runner_options` checks, and readiness detectors
only shorten the window the worker bounds.
"""

import importlib.metadata
import os

from stevedore import driver
from stevedore import exception as stevedore_exception
from stevedore import named

RUNNERS = 'yolo.profiling.runners'
READINESS = 'yolo.profiling.readiness'
# Accelerators a runner may name (a name, then QEMU's ",property=value" settings if any).
ACCELERATORS = ('tcg', 'kvm')
# QEMU options a runner may add, each followed by its value. Nothing that adds a device, a
# network, a chardev or a monitor, or changes the sandbox.
RUNNER_QEMU_OPTIONS = ('-cpu', '-smp', '-machine')
KVM_DEVICE = '/dev/kvm'


class PluginError(Exception):
    """A profiling plugin is unknown, cannot work on this host, or asks for what it may not."""


class Runner:
    """How a profiling boot's QEMU runs."""

    def check_host(self):
        """Called when the worker starts: raises :class:`PluginError` if this host cannot run
        profiling boots this way."""

    def qemu_options(self, options):
        """``{'accel': NAME, 'extra_args': (OPTION, VALUE, ...)}`` for a boot with ``options``
        (a ``yolo_glance.worker.ProfilingOptions``); ``extra_args`` is optional, its options
        among RUNNER_QEMU_OPTIONS."""
        raise NotImplementedError


class TcgRunner(Runner):
    """QEMU's TCG emulation: slow, but works on every host (and in VMs without nested KVM)."""

    def qemu_options(self, options):
        return {'accel': 'tcg'}


class KvmRunner(Runner):
    """Hardware virtualization, for hosts where KVM works."""

    def check_host(self):
        if not os.access(KVM_DEVICE, os.R_OK | os.W_OK):
            raise PluginError('profiling runner kvm: %s is missing, or the worker may not read '
                              'and write it' % KVM_DEVICE)

    def qemu_options(self, options):
        return {'accel': 'kvm'}


class Readiness:
    """Ends a profiling boot's window early. A profiling boot shows two things (it has no
    network device): its serial console and its reads of the image through the learning yolofs
    mount. A detector watches either or both; the window ends on the first detector that fires,
    or at ``max_seconds``."""

    def console_matcher(self, options):
        """An object whose ``search(console_bytes)`` is not None once the guest is ready (a
        compiled RE2 bytes pattern, say), or None."""
        return None

    def idle_seconds(self, options):
        """Seconds without a read of the image that end the window, or None."""
        return None


class ConsoleReadiness(Readiness):
    """The ready pattern (``ready_pattern``, or the image's ``yolo_ready_pattern``)."""

    def console_matcher(self, options):
        return options.compiled_pattern()


class IdleReadiness(Readiness):
    """``idle_seconds`` (or the image's ``yolo_idle_seconds``) without a read of the image."""

    def idle_seconds(self, options):
        return options.idle_seconds


class AnyOf:
    """Console matcher that matches when one of ``matchers`` does (none given: never)."""

    def __init__(self, matchers):
        self.matchers = list(matchers)

    def search(self, data):
        for matcher in self.matchers:
            found = matcher.search(data)
            if found is not None:
                return found
        return None


def runner_options(runner, options):
    """``(accel, extra_args)`` of ``runner`` for a boot with ``options``, checked against what a
    runner may choose."""
    wanted = dict(runner.qemu_options(options))
    accel = wanted.pop('accel', None)
    extra_args = tuple(str(arg) for arg in wanted.pop('extra_args', ()))
    name = type(runner).__name__
    if wanted:
        raise PluginError('profiling runner %s: unknown boot options %s'
                          % (name, ', '.join(sorted(wanted))))
    if not isinstance(accel, str) or accel.split(',')[0] not in ACCELERATORS:
        raise PluginError('profiling runner %s: accelerator %r is not one of %s'
                          % (name, accel, ', '.join(ACCELERATORS)))
    if len(extra_args) % 2 or any(arg not in RUNNER_QEMU_OPTIONS for arg in extra_args[::2]):
        raise PluginError('profiling runner %s: QEMU options %s: only %s, each with its value, '
                          'are allowed' % (name, ' '.join(extra_args),
                                           ', '.join(RUNNER_QEMU_OPTIONS)))
    return accel, extra_args


def names(namespace):
    """The plugin names installed in ``namespace``."""
    return sorted({ep.name for ep in importlib.metadata.entry_points(group=namespace)})


def _load_failed(manager, entry_point, error):
    raise PluginError('cannot load %s plugin %r (%s): %s'
                      % (manager.namespace, entry_point.name, entry_point.value, error))


def load_runner(name):
    """The runner plugin called ``name`` (the worker checks it on this host when it starts)."""
    try:
        manager = driver.DriverManager(RUNNERS, name, invoke_on_load=True,
                                       on_load_failure_callback=_load_failed)
    except stevedore_exception.NoMatches:
        raise PluginError('[yolo_profiling] runner: no profiling runner %r in %s (installed: %s)'
                          % (name, RUNNERS, ', '.join(names(RUNNERS)) or 'none'))
    return manager.driver


def load_readiness(wanted):
    """The readiness detectors called ``wanted``, in that order."""
    if not wanted:
        raise PluginError('[yolo_profiling] readiness names no readiness detector (installed: %s)'
                          % ', '.join(names(READINESS)))
    missing = []
    manager = named.NamedExtensionManager(
        READINESS, wanted, invoke_on_load=True, name_order=True,
        on_load_failure_callback=_load_failed, on_missing_entrypoints_callback=missing.extend)
    if missing:
        raise PluginError('[yolo_profiling] readiness: no readiness detector %s in %s '
                          '(installed: %s)' % (', '.join(map(repr, sorted(missing))), READINESS,
                                               ', '.join(names(READINESS)) or 'none'))
    return [extension.obj for extension in manager]
