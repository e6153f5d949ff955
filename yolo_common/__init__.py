"""Code shared by YOLO's Nova and Glance sides and its tools.

Python never reads boot images itself: it drives the ``yolofs`` binary through its command line
and its control socket (:mod:`yolo_common.yolofs`), boots guests with QEMU
(:mod:`yolo_common.qemu`) and prepares disks the way Nova does (:mod:`yolo_common.images`).
"""
