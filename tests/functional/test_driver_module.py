"""``compute_driver = yolo.YoloLibvirtDriver`` loads wherever Nova is installed: in YOLO's venv,
editable (devstack: Nova from a checkout), and from distro packages with YOLO pip-installed in
another site directory. Each layout is a real Python process; YOLO's wheel is really built and
installed; the finder comes from the .pth file that the wheel puts in site-packages."""

import pathlib
import subprocess
import sys
import sysconfig

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
VENV_SITE = pathlib.Path(sysconfig.get_paths()['purelib'])
PROBE = ('import nova, nova.virt.yolo as m; '
         'print(nova.__file__); print(m.YoloLibvirtDriver.__module__)')


def nova_package():
    import importlib.util
    return pathlib.Path(importlib.util.find_spec('nova').origin).parent


def run(*args, **kwargs):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd='/',
                          env={'OS_NOVA_DISABLE_EVENTLET_PATCHING': '1',
                               'PATH': '/usr/bin:/bin', **kwargs.pop('env', {})}, **kwargs)


@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp('wheel')
    subprocess.run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '-w', str(out),
                    str(REPO)], check=True)
    [built] = out.glob('yolo_openstack-*.whl')
    return built


@pytest.fixture
def nova_elsewhere(tmp_path):
    """Nova's package in a directory of its own, as a checkout or dist-packages holds it."""
    elsewhere = tmp_path / 'nova-dir'
    elsewhere.mkdir()
    (elsewhere / 'nova').symlink_to(nova_package())
    return elsewhere


def test_yolo_in_novas_venv(wheel, tmp_path):
    proc = run('-c', PROBE)
    assert proc.returncode == 0, proc.stderr
    nova_file, driver_module = proc.stdout.split()
    assert nova_file.startswith(str(VENV_SITE))
    assert driver_module == 'yolo_nova.virt.driver'


def test_nova_installed_editable(wheel, nova_elsewhere):
    # An editable install puts the checkout on sys.path (a .pth or PYTHONPATH): Nova is found
    # there, and YOLO's .pth in site-packages still answers for nova.virt.yolo.
    proc = run('-c', PROBE, env={'PYTHONPATH': str(nova_elsewhere)})
    assert proc.returncode == 0, proc.stderr
    nova_file, driver_module = proc.stdout.split()
    assert nova_file.startswith(str(nova_elsewhere))
    assert driver_module == 'yolo_nova.virt.driver'


def test_distro_nova_with_yolo_pip_installed_elsewhere(wheel, nova_elsewhere, tmp_path):
    # Python without its site processing; Nova from "dist-packages", its dependencies on the
    # path as they are for the distro's Python, and YOLO pip-installed into another site
    # directory, whose .pth file site.addsitedir processes as Python does at start.
    target = tmp_path / 'yolo-site'
    subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-deps', '--target',
                    str(target), str(wheel)], check=True)
    assert (target / 'yolo-openstack-nova-virt.pth').exists()
    setup = ('import sys, site; sys.path[:0] = [%r]; sys.path.append(%r); '
             % (str(nova_elsewhere), str(VENV_SITE)))
    with_yolo = run('-S', '-c', setup + 'site.addsitedir(%r); ' % str(target) + PROBE)
    assert with_yolo.returncode == 0, with_yolo.stderr
    assert with_yolo.stdout.split()[0].startswith(str(nova_elsewhere))
    # Without YOLO's site directory, the driver does not exist: the .pth is what provides it.
    without = run('-S', '-c', setup + PROBE)
    assert without.returncode != 0
    assert "No module named 'nova.virt.yolo'" in without.stderr


def test_configure_says_when_nova_cannot_load_the_driver(tmp_path):
    conf = tmp_path / 'nova.conf'
    proc = run('-S', '-c', 'import sys; sys.path[:0] = [%r, %r]; '
               'from yolo_common import configure; sys.exit(configure.main(%r))' % (
                   str(REPO), str(VENV_SITE),
                   ['nova-compute', '--config-file', str(conf)]))
    assert proc.returncode == 1
    assert 'cannot load the driver' in proc.stderr and 'nova.virt.yolo' in proc.stderr
    assert not conf.exists()
