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
# The file executed as nova.virt.yolo.
DRIVER_MODULE = 'yolo_nova.virt.nova_module'


class NovaVirtFinder(importlib.abc.MetaPathFinder):
    """Finds ``nova.virt.yolo`` (and nothing else)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != MODULE:
            return None
        # Looked up when Nova asks, in the yolo_nova the process imports (a checkout ahead of
        # the installed copy, for one).
        driver = importlib.util.find_spec(DRIVER_MODULE)
        return importlib.util.spec_from_file_location(fullname, driver.origin)


def install():
    if not any(type(finder).__name__ == NovaVirtFinder.__name__ for finder in sys.meta_path):
        sys.meta_path.append(NovaVirtFinder())
    # The .pth imported yolo_nova at interpreter start, before sys.path is final: forget it, so
    # that the process imports yolo_nova from where its sys.path says.
    for name in [name for name in sys.modules if name.split('.')[0] == 'yolo_nova']:
        del sys.modules[name]
