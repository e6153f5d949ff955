"""yolofs build / inspect / verify on real files, including every kind of bad input."""

import json
import os
import random
import struct
import subprocess

import pytest

from yolo_common import yolofs

SIZE = 8 << 20


@pytest.fixture
def source(tmp_path):
    rng = random.Random(11)
    path = tmp_path / 'base'
    path.write_bytes(rng.randbytes(SIZE))
    return path


@pytest.fixture
def boot_image(tmp_path, source):
    trace = tmp_path / 'trace'
    trace.write_text('# a boot\n0 512\n1048576 65536\n4096 4096\n7340032 100\n')
    out = tmp_path / 'base.yolo'
    yolofs.run('build', '--trace', trace, '--source', source, '--output', out,
               '--image-id', 'c0ffee00-0000-4000-8000-000000000001',
               '--source-digest', 'auto')
    return out


def fails(*args):
    proc = yolofs.run(*args, check=False)
    assert proc.returncode != 0, proc.stdout
    return proc.stderr


def test_build_inspect_verify_round_trip(boot_image, source):
    info = json.loads(yolofs.run('inspect', '--json', '--extents', boot_image).stdout)
    assert info['identity']['image_id'] == 'c0ffee00-0000-4000-8000-000000000001'
    assert info['identity']['source_digest'].startswith('sha256:')
    assert info['identity']['source_size'] == SIZE
    assert info['identity']['rendition'] == 'raw'
    # 0..512 and 4096..8192 are adjacent blocks but not adjacent in first-access order.
    assert [(e['source_offset'], e['length']) for e in info['extents']] == [
        (0, 4096), (4096, 4096), (1048576, 65536), (7340032, 4096)]
    data = source.read_bytes()
    image = boot_image.read_bytes()
    for extent in info['extents']:
        start = 512 + 32 * len(info['extents']) + extent['data_offset']
        assert image[start:start + extent['length']] == \
            data[extent['source_offset']:extent['source_offset'] + extent['length']]
    assert 'ok: 4 extents' in yolofs.run('verify', boot_image, source).stdout
    assert 'covered' in yolofs.run('inspect', boot_image).stdout


def test_truncated_boot_image_is_rejected(boot_image, source):
    data = boot_image.read_bytes()
    for length in (0, 100, 600, len(data) - 1):
        boot_image.write_bytes(data[:length])
        err = fails('verify', boot_image, source)
        assert 'truncated' in err or 'invalid' in err, err
        fails('inspect', boot_image)


def test_corrupt_data_is_rejected(boot_image, source):
    data = bytearray(boot_image.read_bytes())
    data[-20] ^= 0x01
    boot_image.write_bytes(bytes(data))
    err = fails('verify', boot_image, source)
    assert 'checksum mismatch' in err, err


def test_unknown_version_is_rejected(boot_image, source):
    data = bytearray(boot_image.read_bytes())
    data[8:12] = struct.pack('<I', 99)
    boot_image.write_bytes(bytes(data))
    err = fails('inspect', boot_image)
    # The version is checked before the header checksum, so the message names it.
    assert 'unsupported boot image version 99' in err, err


def test_not_a_boot_image_is_rejected(tmp_path, source):
    other = tmp_path / 'other'
    other.write_bytes(os.urandom(4096))
    assert 'bad magic' in fails('verify', other, source)


def test_mismatching_source_is_rejected(boot_image, source):
    data = bytearray(source.read_bytes())
    data[1048576 + 1000] ^= 0xff
    source.write_bytes(bytes(data))
    err = fails('verify', boot_image, source)
    assert 'extent 2' in err and 'differs' in err, err


def test_source_of_another_size_is_rejected(boot_image, source):
    with open(source, 'ab') as f:
        f.write(b'x')
    assert 'size mismatch' in fails('verify', boot_image, source)


def test_bad_trace_is_rejected(tmp_path, source):
    trace = tmp_path / 'trace'
    trace.write_text('0 4096\nnot a read\n')
    err = fails('build', '--trace', trace, '--source', source, '--output', tmp_path / 'x.yolo')
    assert 'line 2' in err, err
    trace.write_text('# only reads past the end\n%d 10\n' % (SIZE * 2))
    assert 'no reads' in fails('build', '--trace', trace, '--source', source,
                               '--output', tmp_path / 'x.yolo')
    assert not (tmp_path / 'x.yolo').exists()


def test_verify_mark_writes_a_stamp(boot_image, source):
    yolofs.run('verify', '--mark', boot_image, source)
    stamp = json.loads((boot_image.parent / 'base.yolo.verified').read_text())
    assert stamp['source']['size'] == SIZE
    assert stamp['source']['ino'] == os.stat(source).st_ino


def test_inspect_into_a_closed_pipe_ends_quietly(tmp_path, source):
    # 8192 extents: several times what a pipe holds, so yolofs is still writing when head exits.
    trace = tmp_path / 'many'
    trace.write_text(''.join('%d 100\n' % (i * 1024) for i in range(8192)))
    image = tmp_path / 'many.yolo'
    yolofs.run('build', '--trace', trace, '--source', source, '--output', image,
               '--block-size', '512')
    pipeline = subprocess.run(
        ['bash', '-o', 'pipefail', '-c', '"$0" inspect --extents "$1" | head -n 3',
         yolofs.binary(), str(image)], capture_output=True, text=True)
    assert len(pipeline.stdout.splitlines()) == 3
    assert 'panicked' not in pipeline.stderr and pipeline.stderr == ''
    # Killed by SIGPIPE, as other tools are: the shell reports 128 + 13.
    assert pipeline.returncode == 141


def test_errors_say_the_os_message_once(tmp_path, source):
    for args in (('verify', tmp_path / 'missing.yolo', source),
                 ('build', '--trace', tmp_path / 'missing', '--source', source,
                  '--output', tmp_path / 'out.yolo')):
        message = fails(*args)
        assert message.count('No such file or directory') == 1, message
