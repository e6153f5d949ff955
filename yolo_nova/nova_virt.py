"""Makes ``nova.virt.yolo`` importable wherever Nova is installed.

Nova loads compute drivers only as ``nova.virt.<name>``. A module shipped inside Nova's own
package directory works only where pip puts YOLO beside Nova (one venv), not with Nova installed
editable (devstack) or from distro packages with YOLO installed by pip elsewhere. Instead, the
``yolo-openstack-nova-virt.pth`` file that the package installs runs :func:`install` when Python
starts: a finder that answers for ``nova.virt.yolo`` alone, whichever directory ``nova`` came
from, and imports the driver only when Nova asks for it. So ``[DEFAULT] compute_driver =
yolo.YoloLibvirtDriver`` works in all three layouts.
"""

import importlib.abc
import importlib.util
import sys

MODULE = 'nova.virt.yolo'


class _DriverModule(importlib.abc.Loader):

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        from yolo_nova.virt.driver import YoloLibvirtDriver
        module.YoloLibvirtDriver = YoloLibvirtDriver
        module.__all__ = ['YoloLibvirtDriver']


class NovaVirtFinder(importlib.abc.MetaPathFinder):
    """Finds ``nova.virt.yolo`` (and nothing else)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != MODULE:
            return None
        return importlib.util.spec_from_loader(fullname, _DriverModule())


def install():
    if not any(type(finder).__name__ == NovaVirtFinder.__name__ for finder in sys.meta_path):
        sys.meta_path.append(NovaVirtFinder())
