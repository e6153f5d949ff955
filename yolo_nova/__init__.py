"""YOLO's Nova side: the libvirt driver extension that puts instance backing files on yolofs,
boot image fetch and verification on compute nodes, host load reporting, the boot-time model,
``YoloBootFilter`` and its weigher."""
