"""Talking to yolofs: its command line, its control socket, and mounts run as child processes."""

import dataclasses
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time

DEFAULT_SOCKET = '/run/yolofs/control.sock'


class YolofsError(Exception):
    """yolofs refused a request or could not be run. ``refused``: what was handed in (a boot
    image to install) is what is wrong, and offering it again cannot help."""

    def __init__(self, message, refused=False):
        super().__init__(message)
        self.refused = refused


def binary(configured=None):
    """Path of the yolofs command: ``configured`` (a service's option: a path, or a name found
    on PATH), else $YOLOFS_BIN, else ``yolofs`` on PATH."""
    for candidate in (configured, os.environ.get('YOLOFS_BIN'), 'yolofs'):
        path = candidate and shutil.which(candidate)
        if path:
            return path
        if candidate and candidate != 'yolofs':
            raise YolofsError('yolofs binary %s not found or not executable' % candidate)
    raise YolofsError('yolofs binary not found on PATH: install it, or set YOLOFS_BIN (a '
                      'checkout builds it with tools/build-yolofs.sh)')


def run(*args, check=True):
    """Runs ``yolofs ARGS`` and returns the completed process (text output)."""
    proc = subprocess.run([binary(), *map(str, args)], capture_output=True,
                          text=True)
    if check and proc.returncode != 0:
        raise YolofsError('yolofs %s failed (%d): %s' % (
            ' '.join(map(str, args)), proc.returncode, proc.stderr.strip()))
    return proc


def _known(cls, answer):
    """The fields of dataclass ``cls`` that ``answer`` holds (a newer yolofs may say more)."""
    return {field.name: answer[field.name] for field in dataclasses.fields(cls)
            if field.name in answer}


@dataclasses.dataclass(frozen=True)
class BootImage:
    """A boot image yolofs holds, as ``status`` lists it."""
    file: str                   # the base file it is for
    image_id: str = None        # the Glance image the base file belongs to
    verified: bool = False      # loaded, or stamped as matching its base file
    rejected: str = None        # why it was refused (until it changes)
    learned: bool = False       # learned on this host; a published one replaces it

    @property
    def usable(self):
        return not self.rejected


@dataclasses.dataclass(frozen=True)
class Status:
    """yolofs' ``status`` answer: what YOLO reads of it, typed; ``answer`` is all of it (what
    operators' tools print: docs/yolofs.md lists the fields)."""
    boot_images: dict           # base file name: BootImage
    recording: frozenset        # base file names with a boot window open
    # How boot images stay verified when a base file's times are set (docs/yolofs.md).
    touch_safety: str = None
    answer: dict = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def from_answer(cls, answer):
        return cls(boot_images={entry['file']: BootImage(**_known(BootImage, entry))
                                for entry in answer.get('boot_images') or ()},
                   recording=frozenset(window['name'] for window in answer.get('recording') or ()),
                   touch_safety=(answer.get('touch_safety') or {}).get('mechanism'),
                   answer=answer)

    def served_image_ids(self):
        """The Glance image ids of the verified, unrefused boot images."""
        return {entry.image_id for entry in self.boot_images.values()
                if entry.verified and entry.usable and entry.image_id}

    def published_image_ids(self):
        """Those of :meth:`served_image_ids` installed from Glance, not learned here."""
        return {entry.image_id for entry in self.boot_images.values()
                if entry.verified and entry.usable and not entry.learned and entry.image_id}

    def usable(self, name):
        """Whether base file ``name`` has a boot image yolofs has not refused."""
        entry = self.boot_images.get(name)
        return entry is not None and entry.usable


@dataclasses.dataclass(frozen=True)
class HostLoad:
    """``host_load``'s answer: the host's smoothed load as yolofs samples it (utilisations 0..1;
    None: not reported, by an older yolofs or a kernel without the figure)."""
    io_utilisation: float                   # busy time of the disk holding _base
    cpu_utilisation: float = None
    idlest_cpu_utilisation: float = None    # of the least busy CPU of each sample
    iops: float = None                      # the disk's operations per second
    bytes_per_second: float = None
    runnable_per_cpu: float = None
    cpu_pressure: float = None              # PSI's "some" share (None without PSI)
    device: str = None
    smoothing_seconds: float = 10.0         # the averages' time constant
    samples: int = 0

    @classmethod
    def from_answer(cls, answer):
        if 'io_utilisation' not in answer:
            raise YolofsError('host_load: an answer without io_utilisation')
        return cls(**_known(cls, answer))


@dataclasses.dataclass(frozen=True)
class Installed:
    """What ``install`` installed."""
    file: str
    image_id: str
    extents: int
    bytes: int
    seconds: float


@dataclasses.dataclass(frozen=True)
class FillBegun:
    """``fill_begin``'s answer: ``new`` is False when yolofs already served a fill of the file."""
    file: str
    size: int
    new: bool
    filled_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class FillEnded:
    """``fill_end``'s answer: ``boot_image_matches`` (a complete fill) tells whether the boot
    image served during the fill matches the data; None when yolofs did not compare."""
    file: str
    ended: bool
    boot_image_matches: bool = None
    mismatch: str = None


class ControlClient:
    """A client of a running yolofs' JSON-lines control socket."""

    def __init__(self, path=DEFAULT_SOCKET, timeout=30.0):
        self.path = str(path)
        self.timeout = timeout

    def request(self, op, *, timeout=None, **fields):
        """Sends one request; ``timeout`` (seconds) overrides the client's for this one."""
        message = dict(fields, op=op)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout if timeout is None else timeout)
            sock.connect(self.path)
            sock.sendall(json.dumps(message).encode() + b'\n')
            data = b''
            while not data.endswith(b'\n'):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        answer = json.loads(data)
        if not answer.get('ok'):
            raise YolofsError('%s: %s' % (op, answer.get('error')),
                              refused=bool(answer.get('refused')))
        return answer

    def status(self):
        return Status.from_answer(self.request('status'))

    def stats(self, file=None):
        return self.request('stats', file=file)['files']

    def preload(self, file):
        return self.request('preload', file=file)

    def evict(self, file):
        return self.request('evict', file=file)

    def touch(self, file):
        """Has yolofs set base file ``file``'s access and modification times to now, keeping
        its boot image verified (a time set elsewhere costs a verification again)."""
        return self.request('touch', file=file)

    def host_load(self):
        return HostLoad.from_answer(self.request('host_load'))

    def record_stop(self, file):
        return self.request('record_stop', file=file)

    def install(self, file, boot_image_path, image_id, timeout=None):
        """Has yolofs verify the boot image at ``boot_image_path`` against base file ``file``
        and install it as the boot image of Glance image ``image_id``.

        yolofs (root) reads the file once: it must be a regular file (not a symbolic link),
        owned by the caller unless the caller is root, and at most ``--max-boot-image-bytes``.
        The caller deletes it afterwards. Returns the ``installed`` summary (``file``,
        ``image_id``, ``extents``, ``bytes``, ``seconds``); raises :class:`YolofsError` with
        yolofs' reason ("... does not match base file ...") if it was not installed.
        """
        answer = self.request('install', file=file, boot_image=os.path.abspath(boot_image_path),
                              image_id=image_id, timeout=timeout)['installed']
        return Installed(**_known(Installed, answer))

    def remember(self, file, image_id):
        """Records the Glance image id base file ``file`` belongs to (a boot image yolofs
        learns for it then names the image)."""
        return self.request('remember', file=file, image_id=image_id)

    def fill_begin(self, file, boot_image_path, image_id):
        """Has yolofs serve fill file ``file`` (``NAME.yolo-fill`` in the source directory, at
        its final size) from the boot image at ``boot_image_path`` (checked as for ``install``,
        not compared with any data yet) and the ranges reported with :meth:`fill_done`; reads
        of other ranges wait for them (docs/first-boot.md)."""
        answer = self.request('fill_begin', file=file,
                              boot_image=os.path.abspath(boot_image_path), image_id=image_id)
        return FillBegun(**_known(FillBegun, answer))

    def fill_done(self, file, offset, length):
        """Reports bytes ``offset``..``offset + length`` of ``file`` written, final."""
        return self.request('fill_done', file=file, offset=offset, length=length)

    def fill_wants(self, file, wait_seconds=1.0):
        """The (offset, length) ranges reads of ``file`` are waiting for, waiting up to
        ``wait_seconds`` (at most 10) for one."""
        answer = self.request('fill_wants', file=file, wait_ms=int(wait_seconds * 1000),
                              timeout=max(self.timeout, wait_seconds + 10))
        return [tuple(want) for want in answer['wants']]

    def fill_end(self, file, complete, reason=None):
        """Ends the fill of ``file``: complete (every byte written and verified: yolofs then
        compares the boot image with it, ``boot_image_matches``) or failed (its reads fail)."""
        answer = self.request('fill_end', file=file, complete=complete, reason=reason)
        return FillEnded(**_known(FillEnded, answer))

    def prune(self):
        """Has yolofs delete the boot images (and their files) of base files that are gone;
        returns the names of the files deleted."""
        return self.request('prune')['removed']


def is_mounted(path):
    """Whether a yolofs (FUSE) filesystem is mounted at ``path``."""
    path = os.path.realpath(path)
    with open('/proc/self/mountinfo') as mounts:
        for line in mounts:
            fields, _, fs = line.partition(' - ')
            fstype, source = fs.split()[:2]
            if fields.split()[4] == path and fstype.startswith('fuse') \
                    and 'yolofs' in (source, fstype.partition('.')[2]):
                return True
    return False


class Mount:
    """A ``yolofs mount`` run as a child process; a context manager.

    Extra command-line options are given as keyword arguments (``learn=True`` becomes
    ``--learn``, ``record_idle_secs=5`` becomes ``--record-idle-secs 5``). ``preexec_fn`` runs
    in the child before yolofs starts (to join a cgroup, say). ``kept=True`` runs it under
    ``yolofs keep``, which restarts it on the same mount whenever it dies. ``yolofs_binary``:
    the command a service is configured with (see :func:`binary`).
    """

    def __init__(self, source, mountpoint, boot_images, control_socket,
                 log_path=None, preexec_fn=None, kept=False, yolofs_binary=None, **options):
        self.yolofs_binary = yolofs_binary
        self.preexec_fn = preexec_fn
        self.kept = kept
        self.source = pathlib.Path(source)
        self.mountpoint = pathlib.Path(mountpoint)
        self.boot_images = pathlib.Path(boot_images)
        self.control_socket = pathlib.Path(control_socket)
        self.log_path = log_path
        self.options = options
        self.process = None
        self.client = ControlClient(self.control_socket)

    def command(self):
        yolofs = binary(self.yolofs_binary)
        cmd = [yolofs, 'keep', '--'] if self.kept else []
        cmd += [yolofs, 'mount', '--source', str(self.source),
                '--mountpoint', str(self.mountpoint),
                '--boot-images', str(self.boot_images),
                '--control-socket', str(self.control_socket)]
        for name, value in self.options.items():
            flag = '--' + name.replace('_', '-')
            if value is True:
                cmd.append(flag)
            elif value is not False and value is not None:
                cmd += [flag, str(value)]
        return cmd

    def start(self, timeout=30.0):
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, 'ab') if self.log_path else subprocess.DEVNULL
        # A session of its own, as a guest's (qemu.Guest).
        self.process = subprocess.Popen(self.command(), stdout=log,
                                        stderr=subprocess.STDOUT,
                                        preexec_fn=self.preexec_fn, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise YolofsError('yolofs mount exited with %d (log: %s)' % (
                    self.process.returncode, self.log_path))
            if is_mounted(self.mountpoint) and self.control_socket.exists():
                try:
                    self.client.status()
                    return self
                except OSError:
                    pass
            time.sleep(0.05)
        self.stop()
        raise YolofsError('yolofs did not mount %s within %ss' % (
            self.mountpoint, timeout))

    def stop(self, timeout=30.0):
        """SIGTERM, then wait for a clean unmount; returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                subprocess.run(['fusermount3', '-uz', str(self.mountpoint)],
                               check=False)
        code, self.process = self.process.returncode, None
        return code

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
