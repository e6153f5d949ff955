"""The wheel that carries the yolofs binary, for hosts without a Rust toolchain."""

import pathlib
import subprocess
import sys
import zipfile

from yolo_common import yolofs

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_the_wheel_installs_a_working_yolofs_with_pip(tmp_path):
    built = subprocess.run([REPO / 'tools' / 'build-yolofs-wheel.sh', tmp_path / 'wheels'],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    wheel = pathlib.Path(built.stdout.strip())
    assert wheel.parent == tmp_path / 'wheels' and wheel.name.startswith('yolofs-')
    # Nothing but the binary and the wheel's metadata: no Python package to import.
    names = zipfile.ZipFile(wheel).namelist()
    assert [n for n in names if '.dist-info/' not in n] == [
        'yolofs-%s.data/scripts/yolofs' % wheel.name.split('-')[1]]

    venv = tmp_path / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', venv], check=True)
    subprocess.run([sys.executable, '-m', 'pip', '--python', venv / 'bin' / 'python', 'install',
                    '-q', '--no-index', wheel], check=True)
    installed = venv / 'bin' / 'yolofs'
    version = subprocess.run([installed, '--version'], capture_output=True, text=True,
                             check=True).stdout
    assert version == yolofs.run('--version').stdout
    # The installed binary works: it builds a boot image.
    source = tmp_path / 'base'
    source.write_bytes(bytes(range(256)) * 64)
    trace = tmp_path / 'trace'
    trace.write_text('0 4096\n')
    subprocess.run([installed, 'build', '--trace', trace, '--source', source,
                    '--output', tmp_path / 'base.yolo'], check=True, capture_output=True)
    assert (tmp_path / 'base.yolo').read_bytes()[:8] == b'YOLOBOOT'
