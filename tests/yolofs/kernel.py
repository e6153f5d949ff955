"""What the running kernel offers yolofs, as docs/install.md's kernel table states it.

The mount tests run on the kernels of the field (tools/kernel-matrix): where a kernel lacks a
feature they assert the documented fallback instead of skipping.
"""

import os
import re
import subprocess


def release():
    return tuple(int(n) for n in re.findall(r'\d+', os.uname().release)[:2])


def fuse_passthrough():
    """The kernel reads files a FUSE daemon hands it (FUSE_PASSTHROUGH, Linux 6.9)."""
    return release() >= (6, 9)


def notify_resend():
    """A new daemon can have the requests a dead one left unanswered sent again
    (FUSE_NOTIFY_RESEND, Linux 6.9)."""
    return release() >= (6, 9)


# ext4, XFS, Btrfs, tmpfs (statfs types).
LOCAL_FILESYSTEMS = ('ef53', '58465342', '9123683e', '1021994')


def filesystem_type(path):
    return subprocess.run(['stat', '-f', '-c', '%t', str(path)], capture_output=True,
                          text=True, check=True).stdout.strip()


def multigrain_timestamps(path):
    """Every write moves a file's ctime, even within a clock tick: Linux 6.13's multigrain
    timestamps, on ext4, XFS, Btrfs and tmpfs (yolofs' store.rs)."""
    return release() >= (6, 13) and filesystem_type(path) in LOCAL_FILESYSTEMS


def leases_taken(path):
    """yolofs leases base files on local filesystems only (yolofs' lease.rs): on NFS a lease
    would see none of the other clients' writes."""
    return filesystem_type(path) in LOCAL_FILESYSTEMS
