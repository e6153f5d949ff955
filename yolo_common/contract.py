"""The Glance image properties through which the worker, the compute nodes and operators talk.

Both sides import these names: the worker writes them, the driver reads them, and the
deployment (yolo-configure) protects them from tenants and keeps Nova from copying them into
snapshots.
"""

# On a source image, written by the worker.
BOOT_IMAGE_ID = 'yolo_boot_image_id'
STATUS = 'yolo_boot_image_status'
REASON = 'yolo_boot_image_reason'
CLAIM = 'yolo_boot_image_claim'          # "<worker id> <unix time>" while a build runs
# Outcomes recorded in STATUS.
PENDING, BUILDING, READY, SKIPPED, FAILED = 'pending', 'building', 'ready', 'skipped', 'failed'

# On a source image, set by an operator: overrides of the profiling boot.
READY_PATTERN = 'yolo_ready_pattern'
IDLE_SECONDS = 'yolo_idle_seconds'
MAX_SECONDS = 'yolo_max_seconds'
# Where its boot image is held before its first boot: "all" (every host) or "aggregate:UUID"
# (yolo_nova/virt/warming.py, `openstack yolo image warm`).
WARM = 'yolo_warm'

# On a published boot image.
SOURCE_IMAGE_ID = 'yolo_source_image_id'
CONTAINER_FORMAT = 'yolo'
# The worker's signature of the boot image (yolo_common/signing.py).
SIGNATURE = 'yolo_signature'
# Set by a compute host whose first boot found the boot image's bytes other than the image's:
# "<host> <time>: <reason>". No host uses a boot image that has it.
REJECTED = 'yolo_boot_image_rejected'
# What the worker measured, on the published boot image.
BOOT_IMAGE_BYTES = 'yolo_boot_image_bytes'
COVERED_BYTES = 'yolo_covered_bytes'
COVERAGE = 'yolo_coverage'
SOURCE_RAW_SIZE = 'yolo_source_raw_size'
BOOT_SECONDS = 'yolo_boot_seconds'
BUILD_SECONDS = 'yolo_build_seconds'
WINDOW_ENDED_BY = 'yolo_window_ended_by'
# Fleet learning (yolo_glance/fleet.py): the boot image's version in its line (1: a profiling
# boot's, 0: one derived from a relative's; each merge of compute hosts' reports publishes the
# next), and what the merge that made it counted and added.
VERSION = 'yolo_boot_image_version'
MERGED_HOSTS = 'yolo_merged_hosts'
MERGED_BOOTS = 'yolo_merged_boots'
MERGED_BYTES = 'yolo_merged_bytes'
MERGED_FLAVORS = 'yolo_merged_flavors'    # the flavors of the boots counted, comma-separated
# A boot image published before the image's own profiling boot, from a related image's
# (version 0): that image's id.
DERIVED_FROM = 'yolo_derived_from'

# What a snapshot of a server must not inherit from the server's image: the snapshot is another
# image, with another base file, and needs a boot image of its own; the overrides were an
# operator's choice for the source image (and tenants may not set them, so a snapshot that
# carried them would be refused).
NOT_INHERITED = (BOOT_IMAGE_ID, STATUS, REASON, CLAIM, READY_PATTERN, IDLE_SECONDS, MAX_SECONDS,
                 WARM)


def is_boot_image(image, container_format=CONTAINER_FORMAT):
    """A boot image the worker published (or anyone uploaded naming a source image)."""
    return (image.get('container_format') == container_format
            or SOURCE_IMAGE_ID in image)


# Traits of a compute host's resource provider in placement, set by the driver from its yolofs'
# status: what keeps boot images verified across Nova's touches of their base files there
# (docs/yolofs.md). `openstack yolo host list` reads them.
TOUCH_SAFETY_TRAIT_PREFIX = 'CUSTOM_YOLO_TOUCH_SAFETY_'
TOUCH_SAFETY_MECHANISMS = ('leases', 'multigrain_timestamps', 'none', 'unknown')
# A host holding an image warm (its boot image, with or without its base file):
# CUSTOM_YOLO_WARM_ and the image id's hex digits (warming.warm_trait).
WARM_TRAIT_PREFIX = 'CUSTOM_YOLO_WARM_'


def warm_trait(image_id):
    """The trait of a host that holds image ``image_id``'s boot image warm."""
    return WARM_TRAIT_PREFIX + image_id.replace('-', '').upper()


def touch_safety_trait(mechanism):
    """The trait for a mechanism of yolofs' `status` (`touch_safety.mechanism`)."""
    return TOUCH_SAFETY_TRAIT_PREFIX + mechanism.upper()


def touch_safety_of_traits(traits):
    """The mechanism the traits of a resource provider name, or None."""
    for mechanism in TOUCH_SAFETY_MECHANISMS:
        if touch_safety_trait(mechanism) in traits:
            return mechanism
    return None
