"""``yolo-glance-worker``: the boot image worker (:mod:`yolo_glance.service`).

It runs on threads, with oslo.service's threading backend, which must be chosen before anything
imports oslo.service (oslo.messaging does, and would select eventlet, the default).
"""

from oslo_service import backend


def main(argv=None):
    backend.init_backend(backend.BackendType.THREADING)
    from yolo_glance import service
    service.main(argv)
