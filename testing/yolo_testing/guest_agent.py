"""Commands run inside a libvirt guest through the QEMU guest agent, for tests and benchmarks.

The test image runs qemu-guest-agent (``tools/build-test-image.sh``). A domain has the agent's
channel when its XML has ``<channel type='unix'><target type='virtio'
name='org.qemu.guest_agent.0'/></channel>``: ``qemu.libvirt_domain_xml`` adds it, and Nova adds it
for images with ``hw_qemu_guest_agent=yes``. libvirt relays the agent's JSON protocol
(``guest-exec`` starts a process, ``guest-exec-status`` reports its exit and captured output).
"""

import base64
import dataclasses
import json
import time

import libvirt
import libvirt_qemu

CALL_TIMEOUT = 30       # seconds libvirt waits for one answer of the agent


class GuestCommandError(Exception):
    """A command could not be run in the guest, or did not end in time."""


@dataclasses.dataclass
class Completed:
    argv: list
    exit_code: int
    stdout: str
    stderr: str

    def check(self):
        if self.exit_code != 0:
            raise GuestCommandError('%s exited with %s in the guest: %s' % (
                ' '.join(self.argv), self.exit_code, (self.stderr or self.stdout)[-2000:]))
        return self


def call(domain, command, arguments=None):
    """One agent command; its ``return`` value."""
    request = {'execute': command, **({'arguments': arguments} if arguments else {})}
    answer = libvirt_qemu.qemuAgentCommand(domain, json.dumps(request), CALL_TIMEOUT, 0)
    return json.loads(answer)['return']


def wait_for_agent(domain, timeout=300):
    """Waits until the agent answers (it starts late in the guest's boot)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call(domain, 'guest-ping')
        except libvirt.libvirtError as e:
            if time.monotonic() > deadline:
                raise GuestCommandError('the guest agent did not answer within %ss: %s'
                                        % (timeout, e)) from e
            time.sleep(1)


def run(domain, argv, timeout=600):
    """Runs ``argv`` in the guest and waits for its end; its output is captured."""
    wait_for_agent(domain)
    pid = call(domain, 'guest-exec', {'path': argv[0], 'arg': list(argv[1:]),
                                      'capture-output': True})['pid']
    deadline = time.monotonic() + timeout
    while not (status := call(domain, 'guest-exec-status', {'pid': pid}))['exited']:
        if time.monotonic() > deadline:
            raise GuestCommandError('%s still running in the guest after %ss'
                                    % (' '.join(argv), timeout))
        time.sleep(0.5)

    def text(key):
        return base64.b64decode(status.get(key, '')).decode(errors='replace')
    # A process killed by a signal has no exit code: reported as the shell would, 128 + signal.
    exit_code = status.get('exitcode', 128 + status.get('signal', 0))
    return Completed(list(argv), exit_code, text('out-data'), text('err-data'))


def shell(domain, script, timeout=600):
    """Runs a POSIX shell script in the guest (C locale); fails unless it exits with 0."""
    return run(domain, ['/bin/sh', '-c', 'export LC_ALL=C; ' + script], timeout).check()
