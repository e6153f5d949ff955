"""Disk files prepared the way Nova's libvirt driver prepares them."""

import hashlib
import json
import os
import subprocess

from oslo_concurrency import processutils


def base_file_name(image_id):
    """The name Nova gives an image's base file in ``_base``: sha1 of the image id."""
    return hashlib.sha1(image_id.encode()).hexdigest()


def file_digest(fd, algorithm, chunk_bytes=4 << 20):
    """The hex digest (hashlib's ``algorithm``) of the file open at ``fd``, all of it, read as
    stored."""
    digest = hashlib.new(algorithm)
    offset = 0
    while True:
        chunk = os.pread(fd, chunk_bytes, offset)
        if not chunk:
            return digest.hexdigest()
        digest.update(chunk)
        offset += len(chunk)


def info(path):
    """``qemu-img info`` as a dict."""
    out = subprocess.run(['qemu-img', 'info', '--output=json', '-U', str(path)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


# glibc reserves an arena of 64 MiB of address space per thread that allocates: a conversion's
# thread pool then sometimes failed to create a thread ("qemu_thread_create: Resource temporarily
# unavailable") under a 1 GiB address space limit (one conversion in eight). Two arenas are
# enough for qemu-img.
CONVERT_ENVIRONMENT = {'MALLOC_ARENA_MAX': '2'}


def convert_to_raw(source, dest, fmt=None, limits=None):
    """Converts an image to a raw file as Nova's ``force_raw_images`` does. ``fmt``: the
    source's format, as declared (else detected by qemu-img). ``limits``: an
    ``oslo_concurrency.processutils.ProcessLimits`` for qemu-img (untrusted data)."""
    fmt = fmt or info(source)['format']
    # In a session of its own: a signal to its caller's process group (oslo.service's SIGHUP
    # to the worker, which would fail the image's conversion) is not for it.
    processutils.execute('qemu-img', 'convert', '-t', 'none', '-O', 'raw', '-f', fmt,
                         str(source), str(dest), prlimit=limits,
                         env_variables=CONVERT_ENVIRONMENT if limits else None,
                         preexec_fn=os.setsid)


def create_overlay(backing, overlay, backing_format='raw', size=None, open_backing=True):
    """A qcow2 instance disk over ``backing``, as Nova's Qcow2 image backend makes it
    (``size``: its virtual size, if larger than the backing file). ``open_backing`` false:
    ``backing`` is not opened (``size`` is then required), for a base file being filled, which
    only a guest may read."""
    subprocess.run(['qemu-img', 'create', '-f', 'qcow2', '-F', backing_format,
                    '-b', str(backing), str(overlay)] + ([] if open_backing else ['-u'])
                   + ([str(size)] if size else []),
                   check=True, capture_output=True)


def rebase_unsafe(overlay, backing, backing_format='raw'):
    """Points ``overlay`` at another path holding the same bytes (no data copied)."""
    subprocess.run(['qemu-img', 'rebase', '-u', '-F', backing_format,
                    '-b', str(backing), str(overlay)],
                   check=True, capture_output=True)
