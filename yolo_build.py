"""Build step of the package (named in setup.cfg's [global] commands; not installed)."""

import os

from setuptools.command import build_py


class BuildPy(build_py.build_py):
    """Puts yolo-openstack-nova-virt.pth at the top of the wheel, where site-packages gets it:
    it makes nova.virt.yolo importable wherever Nova is installed (yolo_nova/nova_virt.py)."""

    command_name = 'build_py'
    PTH = 'yolo-openstack-nova-virt.pth'

    def run(self):
        super().run()
        self.copy_file(self.PTH, os.path.join(self.build_lib, self.PTH))
