"""YoloBootFilter: discards hosts where a new VM would boot too slowly."""

import logging as std_logging

from oslo_log import log as logging

from nova.scheduler import filters
from nova.scheduler import utils as scheduler_utils

from yolo_nova.model import prediction
from yolo_nova.scheduler import utils

LOG = logging.getLogger(__name__)
CONF = utils.CONF


class YoloBootFilter(filters.BaseHostFilter):
    """Discard hosts whose predicted boot time is over the absolute or relative limit. A host
    is judged by its boot once it holds the image: lacking the image costs a host weight
    (YoloBootTimeWeigher), never its place."""

    # A rebuild stays on its host: there is no other host to prefer.
    RUN_ON_REBUILD = False

    def filter_all(self, filter_obj_list, spec_obj):
        # The relative limit needs every candidate's prediction before deciding on any.
        hosts = list(filter_obj_list)
        image = utils.requested_image(spec_obj)
        # A volume-backed server boots from its volume: no host's prediction says anything.
        if scheduler_utils.request_is_rebuild(spec_obj) or image is None:
            return hosts
        predictions = utils.request_predictions(spec_obj, hosts)
        known = [p.held for p, _ in predictions if p is not None]
        best = min(known) if known else None
        return [host for host, (predicted, state) in zip(hosts, predictions)
                if self._passes(host, predicted, state, best)]

    def host_passes(self, host_state, spec_obj):
        image = utils.requested_image(spec_obj)
        if image is None:
            return True
        [(predicted, state)] = utils.request_predictions(spec_obj, [host_state])
        return self._passes(host_state, predicted, state,
                            predicted.held if predicted is not None else None)

    def _passes(self, host_state, predicted, state, best):
        if predicted is None:
            passes = CONF.yolo.pass_hosts_without_data
            LOG.debug("%(host)s reports no current YOLO data: %(verdict)s",
                      {'host': host_state, 'verdict': 'passes' if passes else 'rejected'})
            return passes
        limit = CONF.yolo.max_predicted_boot_time
        ratio = CONF.yolo.max_boot_time_ratio
        too_slow = bool(limit) and predicted.held > limit
        far_behind = bool(ratio) and best is not None and predicted.held > ratio * best
        if not LOG.isEnabledFor(std_logging.DEBUG):
            return not (too_slow or far_behind)
        LOG.debug("%(host)s: predicted boot %(t).1fs (io %(x).2f, cpu %(y).2f, cpu pressure "
                  "%(p)s, boot image %(bi)s, boots in progress %(n)s; best %(best).1fs, limit "
                  "%(limit)s, ratio %(ratio)s): %(verdict)s; with its fetch %(total).2fs "
                  "(%(path)s %(fetch).3fs)",
                  {'host': host_state, 't': predicted.held, 'x': state.io_utilisation,
                   'y': state.cpu_utilisation,
                   'p': 'unknown' if state.cpu_pressure is None
                   else '%.2f' % prediction.clamp(state.cpu_pressure),
                   'bi': predicted.fetch.boot_image,
                   'n': host_state.num_io_ops, 'best': best, 'limit': limit, 'ratio': ratio,
                   'verdict': 'rejected' if too_slow or far_behind else 'passes',
                   'total': predicted.total, 'path': predicted.fetch.path,
                   'fetch': predicted.fetch.seconds})
        return not (too_slow or far_behind)
