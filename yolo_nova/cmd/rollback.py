"""``yolo-rollback``: put this compute node's instance disks back on ``_base``.

Run as root on a compute node, after ``[yolo] enabled = false`` (docs/install.md)::

    yolo-rollback [--dry-run | --apply] [--format text|json]
                  [--instances-path /var/lib/nova/instances] [--base-dir INSTANCES/_base]
                  [--mount-point /var/lib/nova/yolofs]

Every instance disk (the qcow2 disks an instance directory's ``disk.info`` names, Nova's record
of them, else its files of Nova's disk names) whose backing file is on the yolofs mount gets the
file of the same name in ``_base`` as its backing file (``qemu-img rebase -u``: both hold the
same bytes, so only the header changes), as the driver does when yolofs is down. Nothing else
in an instance directory is read: guests write some of it (``console.log``), and a file a guest
wrote to look like a qcow2 header would otherwise be inspected and rewritten by root. qemu-img
runs with ``-f qcow2``, under Nova's limits of qemu-img, and as the disk's owner without
capabilities (``setpriv``): what a guest wrote reaches no more than its disk's owner may touch.
The scan of QEMU's open files needs root. Disks open in a
QEMU process (running guests) are left: QEMU locks them, and it reads the backing file it opened
at start, on the mount, until the guest stops. Exit status: 0 when no disk is left on the mount,
1 when some are (or could not be inspected), 2 on errors.
"""

import argparse
import json
import os
import shutil
import sys

from oslo_concurrency import processutils
import psutil

QCOW2_MAGIC = b'QFI\xfb'
# The files of an instance directory that Nova's libvirt driver makes as qcow2 disks over
# _base (root, rescue, ephemeral and swap disks), where it has no disk.info.
NOVA_DISK_NAMES = ('disk', 'disk.rescue', 'disk.local', 'disk.swap')
NOVA_EPHEMERAL_PREFIX = 'disk.eph'
DISK_INFO = 'disk.info'
MAX_DISK_INFO_BYTES = 64 << 10
# As Nova bounds qemu-img on its host's files (nova.virt.images.QEMU_IMG_LIMITS).
QEMU_IMG_LIMITS = processutils.ProcessLimits(address_space=1 << 30, cpu_time=30)

ON_BASE = 'on_base'
TO_REWRITE = 'to_rewrite'
REWRITTEN = 'rewritten'
IN_USE = 'in_use'
NO_BASE_FILE = 'no_base_file'
FAILED = 'failed'
# What each state means, in the text output.
TEXT = {
    TO_REWRITE: 'on the mount: would be rewritten to %(base_file)s',
    REWRITTEN: 'rewritten: now backed by %(base_file)s',
    IN_USE: 'on the mount, open in QEMU (pid %(pids)s): left; its guest reads through yolofs '
            'until it stops',
    NO_BASE_FILE: 'on the mount, but %(base_file)s does not exist: left (Nova downloads the '
                  'base file again when the instance starts)',
    FAILED: 'failed: %(error)s',
}


class RollbackError(Exception):
    pass


def is_qcow2(path):
    try:
        with open(path, 'rb') as f:
            return f.read(4) == QCOW2_MAGIC
    except OSError:
        return False


def named_disks(directory):
    """The disks Nova made in instance directory ``directory``: the qcow2 ones its disk.info
    names, or, without one, its files of Nova's disk names."""
    info_path = os.path.join(directory, DISK_INFO)
    try:
        with open(info_path, 'rb') as f:
            named = json.loads(f.read(MAX_DISK_INFO_BYTES + 1)[:MAX_DISK_INFO_BYTES])
        return sorted(path for path, fmt in named.items()
                      if fmt == 'qcow2' and os.path.dirname(path) == directory)
    except FileNotFoundError:
        pass
    except (OSError, ValueError, AttributeError):
        return []      # a disk.info Nova did not write as it writes one
    return [os.path.join(directory, name) for name in sorted(os.listdir(directory))
            if name in NOVA_DISK_NAMES or name.startswith(NOVA_EPHEMERAL_PREFIX)]


def instance_disks(instances_path, skip):
    """The qcow2 instance disks under ``instances_path`` (one directory per instance), outside
    the directories in ``skip``: regular files, not links, with qcow2's magic."""
    for entry in sorted(os.listdir(instances_path)):
        directory = os.path.join(instances_path, entry)
        # Never into the mount: a dead yolofs answers ENOTCONN.
        if directory in skip or os.path.islink(directory) or not os.path.isdir(directory):
            continue
        for path in named_disks(directory):
            if os.path.isfile(path) and not os.path.islink(path) and is_qcow2(path):
                yield path


def qemu_img(disk, *args):
    """qemu-img ``args`` on ``disk`` (its last argument), under Nova's limits, as the disk's
    owner with no capability (when run as root): the disk's content is a guest's."""
    owner = []
    if os.geteuid() == 0:
        stat = os.stat(disk)
        owner = ['setpriv', '--reuid=%d' % stat.st_uid, '--regid=%d' % stat.st_gid,
                 '--clear-groups', '--no-new-privs', '--inh-caps=-all', '--bounding-set=-all',
                 '--']
    out, _ = processutils.execute(*owner, 'qemu-img', *args, disk, prlimit=QEMU_IMG_LIMITS)
    return out


def qemu_img_info(path):
    # --force-share: a running guest's disk is locked by its QEMU. qemu-img info does not open
    # the backing file, so a dead mount does not matter here.
    return json.loads(qemu_img(path, 'info', '-f', 'qcow2', '--force-share', '--output=json'))


def files_open_in_qemu():
    """{path: [pid, ...]} of the files QEMU processes (guests, qemu-nbd, ...) hold open."""
    opened = {}
    for proc in psutil.process_iter(['name']):
        if not (proc.info['name'] or '').startswith('qemu'):
            continue
        # The links alone, not psutil's open_files(), which stats every file: a hung FUSE
        # mount would block it, and another user's learning mount denies even root.
        fd_dir = '/proc/%d/fd' % proc.pid
        try:
            fds = os.listdir(fd_dir)
        except FileNotFoundError:
            continue
        except PermissionError:
            raise RollbackError('cannot see the files QEMU process %d has open: run as root'
                                % proc.pid)
        for fd in fds:
            try:
                path = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            opened.setdefault(path, []).append(proc.pid)
    return opened


class Rollback:
    def __init__(self, instances_path, base_dir, mount_point):
        self.instances_path = os.path.abspath(instances_path)
        self.base_dir = os.path.abspath(base_dir)
        # The driver writes the mount point's real path; accept the path as given too. Not
        # realpath alone: with yolofs dead, the mount point itself cannot be resolved.
        self.mount_dirs = {os.path.normpath(os.path.abspath(mount_point)),
                           os.path.realpath(mount_point)}

    def disks(self, apply):
        """One record per qcow2 disk backed by a file in ``_base`` or on the mount."""
        in_qemu = files_open_in_qemu()
        skip = self.mount_dirs | {self.base_dir}
        records = []
        for disk in instance_disks(self.instances_path, skip):
            try:
                info = qemu_img_info(disk)
            except (processutils.ProcessExecutionError, ValueError) as e:
                records.append(self.record(disk, None, FAILED,
                                           error='qemu-img info: %s' % error_text(e)))
                continue
            backing = info.get('backing-filename')
            if not backing:
                continue
            backing = os.path.normpath(os.path.join(os.path.dirname(disk), backing))
            directory = os.path.dirname(backing)
            if os.path.realpath(directory) == os.path.realpath(self.base_dir):
                records.append(self.record(disk, backing, ON_BASE))
            elif directory in self.mount_dirs:
                fmt = info.get('backing-filename-format') or 'raw'
                pids = in_qemu.get(os.path.realpath(disk), [])
                records.append(self.roll_back(disk, backing, fmt, pids, apply))
        return records

    def roll_back(self, disk, backing, fmt, pids, apply):
        base_file = os.path.join(self.base_dir, os.path.basename(backing))
        if pids:
            return self.record(disk, backing, IN_USE, pids=sorted(pids))
        if not os.path.isfile(base_file):
            return self.record(disk, backing, NO_BASE_FILE)
        if not apply:
            return self.record(disk, backing, TO_REWRITE)
        try:
            # -u: the header only; the _base file holds the same bytes as its mirror.
            qemu_img(disk, 'rebase', '-u', '-f', 'qcow2', '-F', fmt, '-b', base_file)
        except processutils.ProcessExecutionError as e:
            # Also a guest that started since the scan: QEMU holds the disk's lock.
            return self.record(disk, backing, FAILED, error='qemu-img rebase: %s' % error_text(e))
        return self.record(disk, backing, REWRITTEN)

    def record(self, disk, backing, state, pids=(), error=None):
        relative = os.path.relpath(disk, self.instances_path)
        return {
            'disk': disk,
            # Nova's instance directories are named by the instance's UUID.
            'instance': relative.split(os.sep)[0] if os.sep in relative else None,
            'backing_file': backing,
            'base_file': os.path.join(self.base_dir, os.path.basename(backing))
            if backing else None,
            'state': state,
            'pids': list(pids),
            'error': error,
        }


def error_text(e):
    if isinstance(e, processutils.ProcessExecutionError):
        return (e.stderr or e.stdout or str(e)).strip()
    return str(e)


def summary(records):
    counts = {}
    for r in records:
        counts[r['state']] = counts.get(r['state'], 0) + 1
    return counts


def left_on_mount(records):
    return [r for r in records if r['state'] not in (ON_BASE, REWRITTEN)]


def print_text(records):
    for r in records:
        if r['state'] != ON_BASE:
            pids = ', '.join(str(p) for p in r['pids'])
            print('%s: %s' % (r['disk'], TEXT[r['state']] % dict(r, pids=pids)))
    counts = summary(records)
    print('%d disks backed by _base or the mount: %s' % (
        len(records), ', '.join('%d %s' % (n, s.replace('_', ' '))
                                for s, n in sorted(counts.items())) or 'none'))
    if counts.get(TO_REWRITE):
        print('Run again with --apply to rewrite them.')
    if counts.get(IN_USE):
        print('yolofs must keep running until the guests above have stopped. With [yolo] '
              'enabled = false, their next start (hard reboot, or stop and start) puts them on '
              '_base; then run this again.')
    if not left_on_mount(records):
        print('No instance disk is backed by the yolofs mount.')


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog='yolo-rollback',
        description="Put this compute node's instance disks back on _base: every qcow2 disk "
                    "backed by a file on the yolofs mount gets the file of the same name in "
                    "_base (qemu-img rebase -u). Disks of running guests are reported and left. "
                    "Exit status: 0 when no disk is left on the mount, 1 when some are, "
                    "2 on errors.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument('--dry-run', dest='apply', action='store_false',
                      help='only report what would be done (the default)')
    mode.add_argument('--apply', dest='apply', action='store_true',
                      help='rewrite the disks of stopped instances')
    parser.set_defaults(apply=False)
    parser.add_argument('--instances-path', default='/var/lib/nova/instances',
                        help="Nova's [DEFAULT] instances_path (default: %(default)s)")
    parser.add_argument('--base-dir', default=None,
                        help="the image cache (default: INSTANCES_PATH/_base)")
    parser.add_argument('--mount-point', default='/var/lib/nova/yolofs',
                        help="yolofs' mount point, [yolo] mount_point (default: %(default)s)")
    parser.add_argument('--format', choices=('text', 'json'), default='text',
                        help='output format (default: %(default)s)')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    base_dir = args.base_dir or os.path.join(args.instances_path, '_base')
    try:
        if not os.path.isdir(args.instances_path):
            raise RollbackError('%s is not a directory (--instances-path)' % args.instances_path)
        if shutil.which('qemu-img') is None:
            raise RollbackError('qemu-img not found')
        records = Rollback(args.instances_path, base_dir, args.mount_point).disks(args.apply)
    except RollbackError as e:
        print('yolo-rollback: %s' % e, file=sys.stderr)
        return 2
    if args.format == 'json':
        json.dump({'mode': 'apply' if args.apply else 'dry-run',
                   'instances_path': os.path.abspath(args.instances_path),
                   'base_dir': os.path.abspath(base_dir),
                   'mount_point': os.path.abspath(args.mount_point),
                   'disks': records,
                   'counts': summary(records),
                   'left_on_mount': len(left_on_mount(records))}, sys.stdout, indent=2)
        print()
    else:
        print_text(records)
    return 1 if left_on_mount(records) else 0


if __name__ == '__main__':
    sys.exit(main())
