"""YOLO's options for Nova, in the ``[yolo]`` group.

Registered with :func:`register_opts` (the scheduler filter and weigher do it on Nova's CONF when
loaded) and listed for ``oslo-config-generator`` by :func:`list_opts` (entry point
``oslo.config.opts``: ``yolo_nova``).
"""

from oslo_config import cfg

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
        'boot_time_weight_multiplier', default=1.0,
        help="""
Multiplier of ``YoloBootTimeWeigher``. Positive values prefer hosts where a new VM is predicted
to boot faster, negative values the opposite, 0 disables the weigher. Can be overridden per
aggregate with the ``yolo_boot_time_weight_multiplier`` metadata key.
"""),
]


def register_opts(conf):
    conf.register_group(yolo_group)
    conf.register_opts(scheduler_opts, group=yolo_group)


def list_opts():
    return [(yolo_group, scheduler_opts)]
