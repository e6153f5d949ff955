"""Options of ``yolo-glance-worker`` (listed for ``oslo-config-generator`` as ``yolo_glance``).

* ``[yolo_worker]``: what the worker does and how much at once.
* ``[yolo_profiling]``: the profiling boot that learns a boot image.
* ``[yolo_fleet]``: merging compute hosts' boot reports into new versions of boot images.
* ``[glance]``: how the worker reaches Glance (keystoneauth session and auth options).
* ``[oslo_messaging_notifications]`` and ``transport_url``: where Glance's notifications arrive.
"""

from keystoneauth1 import loading as ks_loading
from oslo_config import cfg

worker_group = cfg.OptGroup('yolo_worker', title='YOLO boot image worker')
profiling_group = cfg.OptGroup('yolo_profiling', title='YOLO profiling boots')
fleet_group = cfg.OptGroup('yolo_fleet', title='YOLO fleet learning')
GLANCE_GROUP = 'glance'

worker_opts = [
    cfg.StrOpt('work_dir', default='/var/lib/yolo/worker',
               help='Scratch space: downloads, raw conversions, learning mounts.'),
    cfg.IntOpt('max_concurrent_builds', default=1, min=1,
               help='Boot images built at once (each one downloads, converts and boots).'),
    cfg.IntOpt('max_queued_per_project', default=50, min=1,
               help="""
Builds queued at most per project (an image's owner). Projects take turns for the build slots,
so one project's uploads delay another's next build by one build at most; builds past this
bound are not queued (``yolo_worker_jobs_refused_total``), and the periodic scan queues them
again later.
"""),
    cfg.StrOpt('notification_pool',
               help="""
oslo.messaging pool of the notification listener. Unset (the default), workers consume the
topic's own queue and share its notifications. Set it only where the worker shares a topic with
other consumers (Glance's default ``notifications``): a pool gets its own queue, and the topic's
queue, which RabbitMQ keeps for its other consumers, then fills if nobody else reads it.
"""),
    cfg.ListOpt('notification_topics', default=['yolo_notifications'],
                help="""
Topics Glance sends notifications on. A topic of the worker's own, added to glance-api's
``[oslo_messaging_notifications] topics``, so that no queue fills for want of a consumer.
"""),
    cfg.StrOpt('notification_exchange', default='glance',
               help="Glance's notification exchange."),
    cfg.IntOpt('scan_interval', default=600, min=0,
               help="""
Seconds between scans for active images without a boot image (the backstop for lost notifications
and for images uploaded before the worker was installed). 0 disables the scan.
"""),
    cfg.IntOpt('activation_timeout', default=120, min=0,
               help="""
Seconds to wait for an image named in an ``image.activate`` notification to be ``active`` in the
API (the notification is sent before the database says so).
"""),
    cfg.IntOpt('claim_timeout', default=7200, min=60,
               help="""
Seconds after which a build claimed by another worker that never finished is taken over.
"""),
    cfg.IntOpt('retries', default=3, min=0,
               help='Retries of a build after a transient error (Glance unreachable, I/O).'),
    cfg.StrOpt('container_format', default='yolo',
               help="""
container_format of published boot images. Glance must accept it: add it to its
``[image_format] container_formats``.
"""),
    cfg.IntOpt('max_virtual_size_gib', default=128, min=1,
               help="""
Images whose disk (virtual size) is larger get no boot image (skipped, with the reason). A build
converts the image to raw in ``work_dir``, as large as its virtual size whatever the upload's
size (a small qcow2 image can describe a large disk of data): this bounds the scratch space a
tenant's upload can take. A build starts only with that much free in ``work_dir`` (plus 1 GiB),
and qemu-img may write no file larger.
"""),
    cfg.StrOpt('yolofs_binary', default='yolofs', help='The yolofs command.'),
    cfg.StrOpt('signing_key_file',
               help="""
The worker's Ed25519 private key (PEM), with which it signs every boot image it publishes:
compute hosts serve a boot image before its image's download only if its signature verifies
with one of their ``[yolo] boot_image_signing_keys``. Readable by the worker's user only, and
by nothing the profiling boots run. ``yolo-configure worker --signing-key-file FILE`` makes one
and prints its public key. Unset: boot images are published unsigned, and compute hosts use
them only once the image is downloaded (yolofs verifies them against it).
"""),
    cfg.HostAddressOpt('metrics_address', default='127.0.0.1',
                       help="""
Address the worker serves its Prometheus metrics on (``http://ADDRESS:PORT/metrics``, without
authentication or TLS: keep it local, or reachable only by the Prometheus server).
"""),
    cfg.PortOpt('metrics_port', default=9465,
                help='Port of the Prometheus metrics; 0 does not serve them.'),
]

profiling_opts = [
    cfg.StrOpt('ready_pattern',
               default=r'login:|Cloud-init v\. .* finished|YOLO-GUEST-READY',
               help="""
Regular expression that, when it appears on the guest's serial console, ends the profiling boot
(the ``console`` readiness detector). Per image: the ``yolo_ready_pattern`` property.
"""),
    cfg.FloatOpt('idle_seconds', default=30.0, min=1.0,
                 help="""
With the ``idle`` readiness detector, the profiling boot also ends after this many seconds
without a read of the image. Per image: ``yolo_idle_seconds`` (at most ``max_seconds``).
"""),
    cfg.FloatOpt('max_seconds', default=600.0, min=10.0,
                 help="""
The profiling boot ends after this many seconds at the latest. Per image: ``yolo_max_seconds``,
which can only be lower: this is also the operator's maximum.
"""),
    cfg.StrOpt('runner', default='tcg', deprecated_name='accel',
               help="""
How profiling boots run QEMU: a plugin of the ``yolo.profiling.runners`` entry point group.
``tcg`` (QEMU's emulation: works on every host) and ``kvm`` (hardware virtualization: the worker's
user needs ``/dev/kvm``) come with YOLO. Whatever the runner, the guest has no network device and
runs in QEMU's seccomp sandbox, within ``max_seconds`` and ``max_memory_mib``.
"""),
    cfg.BoolOpt('sandbox', default=True,
                help="""
Run profiling boots' QEMU in the worker's sandbox (bubblewrap: no network, none of the host's
files but ``/usr`` and the boot's own, no other process in sight, resource limits;
docs/glance-worker.md, "Threat model"). It needs the ``bubblewrap`` package and unprivileged user
namespaces; the worker refuses to start if it cannot run. Off: QEMU runs as the worker's user
with all it can read and reach (its configuration's credentials, the cloud's services): only for
a worker that profiles trusted images.
"""),
    cfg.ListOpt('readiness', default=['console', 'idle'],
                help="""
What ends a profiling boot's window before ``max_seconds`` (the first that fires): plugins of the
``yolo.profiling.readiness`` entry point group. ``console``: ``ready_pattern`` on the serial
console; ``idle``: ``idle_seconds`` without a read of the image. Without ``idle``, a boot that
never shows the ready pattern fails at ``max_seconds``.
"""),
    cfg.IntOpt('memory_mib', default=1024, min=128,
               help='Guest memory of profiling boots (per image: the min_ram of the image).'),
    cfg.IntOpt('max_memory_mib', default=4096, min=128,
               help="The most memory a profiling boot gets, whatever the image's min_ram."),
    cfg.IntOpt('min_boot_bytes', default=1 << 20, min=0,
               help="""
A profiling boot that never showed the ready pattern and read fewer bytes than this did not
boot (a BIOS reading a blank disk's first sector, say): the image is marked failed.
"""),
    cfg.IntOpt('block_size', default=4096, min=512,
               help='Block size of learned boot images, in bytes.'),
]

fleet_opts = [
    cfg.BoolOpt('enabled', default=True,
                help="""
Merge what compute hosts' boots read outside a published boot image (their boot reports,
nova-compute's ``[yolo] boot_reports``) into its next version (docs/glance-worker.md, "Fleet
learning"). Off: reports are not listened to.
"""),
    cfg.StrOpt('report_topic', default='yolo_boot_reports',
               help="""
Topic compute hosts send boot reports on (their ``[yolo] boot_report_topic``).
"""),
    cfg.StrOpt('report_exchange', default='nova',
               help="Exchange of boot reports: Nova's control exchange."),
    cfg.IntOpt('threshold', default=2, min=1,
               help="""
Boots that must have read a block outside the boot image for a merge to add it, each host's
counted at most ``host_votes`` times: one boot's stray reads do not grow every host's memory.
"""),
    cfg.IntOpt('host_votes', default=1, min=1,
               help="""
How many of one host's boots count toward a block's ``threshold``. 1: a block needs boots on
``threshold`` hosts, so that neither one host nor one tenant's boots on one host grow the boot
image of every host.
"""),
    cfg.FloatOpt('max_growth', default=1.0, min=0.0,
                 help="""
A merge adds at most this share of what the boot image holds (1.0: it may double), the blocks
most boots read first.
"""),
    cfg.IntOpt('max_boot_image_mib', default=1024, min=1,
               help="""
No merge makes a boot image hold more than this (compute hosts' ``[yolo] max_boot_image_bytes``
refuses larger ones).
"""),
    cfg.IntOpt('merge_interval', default=600, min=0,
               help="Seconds between two merges of one image's reports (each downloads it)."),
    cfg.IntOpt('max_report_age_days', default=30, min=1,
               help='Reports older than this are forgotten.'),
]


def register_opts(conf):
    # Groups of their own: ConfigOpts copies a group shallowly, so options registered through a
    # shared OptGroup would share their overrides between ConfigOpts objects.
    for group, opts in ((worker_group, worker_opts), (profiling_group, profiling_opts),
                        (fleet_group, fleet_opts)):
        conf.register_group(cfg.OptGroup(group.name, title=group.title))
        conf.register_opts(opts, group=group.name)
    ks_loading.register_session_conf_options(conf, GLANCE_GROUP)
    ks_loading.register_auth_conf_options(conf, GLANCE_GROUP)
    ks_loading.register_adapter_conf_options(conf, GLANCE_GROUP)


def list_opts():
    return [
        (worker_group, worker_opts),
        (profiling_group, profiling_opts),
        (fleet_group, fleet_opts),
        # The password plugin's options: the one yolo-configure sets up.
        (GLANCE_GROUP, ks_loading.get_session_conf_options()
         + ks_loading.get_auth_common_conf_options()
         + ks_loading.get_auth_plugin_conf_options('password')
         + ks_loading.get_adapter_conf_options(include_deprecated=False)),
    ]
