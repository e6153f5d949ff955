"""YOLO's Glance side: the import plugin that marks images awaiting a boot image, and the worker
that learns each active image's boot image from a profiling boot and publishes it."""
