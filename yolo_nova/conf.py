"""YOLO's options for Nova in the ``[yolo]`` group: the scheduler's and the compute node's.

Registered with :func:`register_opts` (the scheduler filter, the weigher and the compute driver
do it on Nova's CONF when loaded) and listed for ``oslo-config-generator`` (entry points
``oslo.config.opts``): all by :func:`list_opts` (``yolo_nova``), the compute node's by
:func:`list_compute_opts` (``yolo_nova.compute``) and the scheduler's by
:func:`list_scheduler_opts` (``yolo_nova.scheduler``), one sample each in etc/. The options that
set the boot-time model's parameters come from its table (yolo_nova.model.parameters).
"""

from oslo_config import cfg

from yolo_nova.model import parameters

yolo_group = cfg.OptGroup(
    'yolo', title='YOLO boot-time aware scheduling and boot images',
    help='Options of YOLO for OpenStack on Nova\'s scheduler and compute nodes.')

scheduler_opts = [
    cfg.FloatOpt(
        'max_predicted_boot_time', default=0.0, min=0.0,
        help="""
Hosts where a new VM of the requested image is predicted to boot in more than this many seconds
are discarded by ``YoloBootFilter``.

Possible values:

* 0: no absolute limit.
* A positive number of seconds.

Related options:

* ``max_boot_time_ratio``
"""),
    cfg.FloatOpt(
        'max_boot_time_ratio', default=2.0, min=0.0,
        help="""
Hosts whose predicted boot time exceeds this multiple of the best candidate host's are discarded
by ``YoloBootFilter``: with the default, a host where a VM would boot more than twice as slowly as
on the fastest candidate is not used while the faster one is.

Possible values:

* 0: no relative limit.
* A number >= 1.

Related options:

* ``max_predicted_boot_time``
"""),
    cfg.BoolOpt(
        'pass_hosts_without_data', default=True,
        help="""
Whether hosts that report no YOLO load data (or only stale data) pass ``YoloBootFilter``. They
are never compared with the best host: their boot time is unknown.

Related options:

* ``stats_max_age``
"""),
    cfg.IntOpt(
        'stats_max_age', default=300, min=1,
        help="""
Seconds after which the load a host reported is considered stale and ignored. Compute nodes
report every periodic resource update (60 s by default).
"""),
    cfg.FloatOpt(
        'boot_time_weight_multiplier', default=4.0,
        help="""
Multiplier of ``YoloBootTimeWeigher``. Positive values prefer hosts where a new VM is predicted
to boot faster, negative values the opposite, 0 disables the weigher. Can be overridden per
aggregate with the ``yolo_boot_time_weight_multiplier`` metadata key. Nova's RAM, CPU and disk
weighers weigh up to 1 each: at 4 the predicted boot time decides when they disagree with it
(at 1, a host with more free disk won over one predicted faster), and the build failure and
cross-cell weighers (1000000) still override it.
"""),
]


compute_opts = [
    cfg.BoolOpt(
        'enabled', default=True,
        help="""
Whether ``YoloLibvirtDriver`` puts new root disks' backing files on the yolofs mount. When
disabled, or when yolofs is not mounted and healthy, disks keep their ``_base`` backing file and
instances are rebased back onto ``_base`` before they start: the driver then behaves as
``libvirt.LibvirtDriver``.
"""),
    cfg.StrOpt(
        'mount_point', default='/var/lib/nova/yolofs',
        help="""
Where yolofs mirrors this host's image cache (``[DEFAULT] instances_path``/``_base``). Must match
``yolofs mount --mountpoint``.
"""),
    cfg.BoolOpt(
        'detach_after_boot', default=True,
        help="""
Move a running guest's disks from the yolofs mount to the same files in ``_base`` once its boot
is over (two shallow block copies through libvirt, each ending with a pivot that holds the disk's
I/O for milliseconds): after its boot a guest never depends on yolofs. Its next start puts it
back on the mount.
"""),
    cfg.FloatOpt(
        'detach_settle_seconds', default=10.0, min=0,
        help="""
A guest's boot is over once yolofs' boot window of its base file has ended (after
``yolofs mount --record-idle-secs`` without a read) and at least this many seconds have passed
since it started.
"""),
    cfg.FloatOpt(
        'detach_max_seconds', default=600.0, min=0,
        help="""
Detach a guest this many seconds after its start even if reads of its base file go on (other
guests of the same image booting, or a guest that reads its image for good).
"""),
    cfg.StrOpt(
        'boot_image_dir', default='/var/lib/yolo/boot-images',
        deprecated_for_removal=True,
        deprecated_reason='The boot image store is private to yolofs: boot images fetched from '
                          'Glance are installed through its control socket.',
        help="Not used: yolofs' boot image store (``yolofs mount --boot-images``)."),
    cfg.StrOpt(
        'control_socket', default='/run/yolofs/control.sock',
        help="""
yolofs' control socket (``yolofs mount --control-socket``). nova-compute's user must be allowed
to connect: run yolofs with ``--control-socket-group`` set to a group of that user (and the default
``--control-socket-mode 0660``).
"""),
    cfg.FloatOpt(
        'control_timeout', default=5.0, min=0.1,
        help="""
Seconds to wait for an answer on yolofs' control socket. yolofs not answering in time counts as
yolofs being down: disks keep or get their ``_base`` backing file.
"""),
    cfg.StrOpt(
        'yolofs_binary', default='yolofs',
        deprecated_for_removal=True,
        deprecated_reason='yolofs verifies the boot images it installs itself.',
        help="Not used: the yolofs command."),
    cfg.BoolOpt(
        'fetch_boot_images', default=True,
        help="""
Whether to download an image's published boot image (image property ``yolo_boot_image_id``) from
Glance when the image is cached on this host, and have yolofs verify and install it. Images
without one are learned from their first boot on the host when yolofs runs with ``--learn``.
"""),
    cfg.BoolOpt(
        'first_boot_before_download', default=True,
        help="""
Start the first guest of an image on this host before the image is downloaded
(docs/first-boot.md): when its base file is not cached, yolofs is healthy and Glance publishes
a trusted boot image for it, the boot image is fetched, the instance disk is created over the
base file as yolofs serves it while it is being filled, and the download fills it in the
background (ranges the guest waits for first, for images stored raw in Glance). An image
without a trusted boot image, a cached base file or yolofs down: Nova's own download, as without
this option. On by default since the all-in-one's end-to-end tests showed it safe (first boots,
failed fills, nova-compute restarted midway: docs/first-boot.md).

Related options:

* ``fetch_boot_images`` must be on.
* ``yolofs mount --fill-read-timeout-secs``: how long a guest's read waits for a range.
* ``first_boot_paced_rate_mib``, ``first_boot_paced_seconds``: the download while guests boot.
"""),
    cfg.IntOpt(
        'first_boot_paced_rate_mib', default=16, min=0,
        help="""
While guests boot over a base file being filled, its in-order download from Glance (images
stored raw) goes at most this many MiB a second; 0: at the link's rate. The guests need nothing
from it (their boot image covers their boot; a range a read waits for is fetched at once, not
paced), and moving the image at the link's rate takes CPU and memory bandwidth from them
(docs/first-boot.md, "How it works").
"""),
    cfg.FloatOpt(
        'first_boot_paced_seconds', default=60.0, min=0,
        help="""
How long the download of a base file being filled is paced after each guest starts over it
(``first_boot_paced_rate_mib``): about the longest idle boot of the host's guests.
"""),
    cfg.StrOpt(
        'download_dir',
        help="""
Where boot images are downloaded from Glance before yolofs installs them (each is deleted once
yolofs has answered). A directory of nova-compute's own; yolofs (root) reads the files in it.
Unset: ``yolo-incoming`` in ``[DEFAULT] instances_path``.
"""),
    cfg.IntOpt(
        'warm_budget_mb', default=4096, min=0,
        help="""
The most the warm store holds, in MiB: the boot images of the images an operator made warm where
this host is (``openstack yolo image warm``), held before their base files so that a first boot
of them starts with nothing to fetch (docs/operations.md, "Warming hosts"). Past it, the boot images
of images no longer warm go first, then those used least recently. 0: no warming.
"""),
    cfg.IntOpt(
        'warm_interval', default=600, min=10,
        help="Seconds between this host's looks at the images warm where it is."),
    cfg.StrOpt(
        'boot_image_owner',
        help="""
The project (id) that publishes boot images: yolo-glance-worker's. Boot images are fetched with
the service identity of ``[service_user]`` and only those this project owns are used. Unset: the
service identity's own project (the worker and Nova's service users share the ``service``
project in most deployments).
"""),
    cfg.ListOpt(
        'boot_image_signing_keys', default=[], secret=False,
        help="""
The public keys of yolo-glance-worker's signing key (``[yolo_worker] signing_key_file``; each
the base64 line ``yolo-configure signing-key`` prints), several while a key is replaced. Boot
images are used only with a signature of one of them over the bytes downloaded. Empty: boot
images are used only once their image is downloaded (yolofs verifies them against it), and no
first boot runs before a download (``first_boot_before_download``).
"""),
    cfg.IntOpt(
        'max_boot_image_bytes', default=1 << 30, min=0,
        help="Boot images larger than this are not downloaded."),
    cfg.FloatOpt(
        'install_timeout', default=120.0, min=1.0,
        help="""
Seconds to wait for yolofs to verify and install a downloaded boot image (it compares every
extent with the base file). The disk is created either way.
"""),
    cfg.StrOpt(
        'calibration_file', default='/var/lib/yolo/calibration.json',
        help="""
This host's calibration, written by ``yolo-calibrate``: its boot-time parameters and its disk's
capacity, reported to the scheduler. The options below override it.
"""),
    # The boot-time model's parameters that an operator may set here, from its table.
    *[cfg.FloatOpt(p.option, min=p.bounds[0], max=p.option_max,
                   help=p.option_help.format(default=p.default))
      for p in parameters.PARAMETERS if p.option],
    cfg.FloatOpt(
        'disk_iops', min=0.0,
        help="""
Operations per second the instance disk sustains. With it (or with ``disk_bytes_per_second``)
the reported I/O utilisation is the thesis' throughput utilisation; without either, the fraction
of time the disk was busy. Unset: from ``calibration_file``.
"""),
    cfg.FloatOpt(
        'disk_bytes_per_second', min=0.0,
        help="""
Bytes per second the instance disk sustains. Unset: from ``calibration_file``.
"""),
    cfg.StrOpt(
        'boot_ready_pattern', default=r'login: *$',
        help="""
A regular expression (Python's, multi-line) that a guest's console matches once it has booted:
each guest spawned on this host is timed from its start to it, and the last boots give the
boot-time parameters the host reports (``learn_from_boots``). The default matches the login
prompt that cloud images print on their serial console. Empty: no boot is timed.
"""),
    cfg.FloatOpt(
        'boot_ready_timeout', default=600.0, min=1.0,
        help="Seconds after its start a guest's boot stops being timed if it is not ready."),
    cfg.StrOpt(
        'observed_boots_file', default='$state_path/yolo/observed-boots.json',
        help="Where nova-compute keeps the last boots it timed (``boot_ready_pattern``)."),
    cfg.StrOpt(
        'transfers_file', default='$state_path/yolo/transfers.json',
        help="""
Where nova-compute keeps its last downloads from Glance and conversions to raw, from which it
measures the rates it reports (``glance_bytes_per_second``, ``convert_bytes_per_second``).
"""),
    cfg.IntOpt(
        'learn_from_boots', default=3, min=0,
        help="""
How many timed boots of a kind (served from a boot image, or not) this host needs before it
reports the parameters they give instead of ``calibration_file``'s: beta and ``alpha_yolo`` from
boots served from a boot image, alpha from the others (medians of the last 20, brought back to
an idle host through the model). 0: never; the ``boot_time_*`` options above win either way.
"""),
    cfg.BoolOpt(
        'boot_reports', default=True,
        help="""
Send the worker what this host's boots read outside their published boot images (extents of
the base file, no data), so that it publishes a next version with what boots through Nova read
and profiling boots missed (fleet learning, docs/glance-worker.md). Sent on Nova's notification
transport with oslo.messaging's ``messagingv2`` driver, whatever ``[oslo_messaging_notifications]
driver`` says, on ``boot_report_topic``.
"""),
    cfg.StrOpt(
        'boot_report_topic', default='yolo_boot_reports',
        help="The topic of boot reports: the worker's ``[yolo_fleet] report_topic``."),
    cfg.StrOpt(
        'boot_report_transport_url', secret=True,
        help="""
Where boot reports go, if not on Nova's notification transport (``[oslo_messaging_notifications]
transport_url``, or ``[DEFAULT] transport_url``): the transport the worker listens on, where a
cell's compute hosts send their notifications to a broker of the cell's own.
"""),
    cfg.IntOpt(
        'boot_image_version_check_interval', default=600, min=0,
        help="""
Seconds between two checks, at boots of an image, whether Glance publishes a newer boot image
of it than the one installed here (a fleet merge); a newer one is fetched and installed in place
of it. 0: at every boot.
"""),
]


def register_opts(conf):
    conf.register_group(yolo_group)
    conf.register_opts(scheduler_opts, group=yolo_group)
    conf.register_opts(compute_opts, group=yolo_group)


def list_opts():
    return [(yolo_group, scheduler_opts + compute_opts)]


def list_compute_opts():
    return [(yolo_group, compute_opts)]


def list_scheduler_opts():
    return [(yolo_group, scheduler_opts)]
