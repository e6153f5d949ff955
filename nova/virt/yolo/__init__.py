"""Nova loads compute drivers only from ``nova.virt``: this module makes YOLO's driver loadable
as ``[DEFAULT] compute_driver = yolo.YoloLibvirtDriver``. The driver lives in ``yolo_nova``."""

from yolo_nova.virt.driver import YoloLibvirtDriver

__all__ = ['YoloLibvirtDriver']
