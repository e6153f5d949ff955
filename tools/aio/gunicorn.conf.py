"""gunicorn settings shared by the all-in-one cloud's API services (one worker each)."""
import sys

workers = 1
worker_class = 'gthread'
threads = 4
timeout = 600
graceful_timeout = 5
# gunicorn closes an idle connection after 2 s by default, the interval at which the openstack
# client's --wait polls: a poll sent as the server closes the connection fails with
# RemoteDisconnected. Keep idle connections longer than any client's poll interval.
keepalive = 30
accesslog = '-'
errorlog = '-'


def post_fork(server, worker):
    # The OpenStack WSGI applications parse sys.argv with oslo.config when they are loaded,
    # which happens after this in the worker: gunicorn's own arguments are not theirs.
    del sys.argv[1:]


def post_worker_init(worker):
    # Neutron 29's get_port(s) reads Port.port_forwardings, a backref that exists only once
    # SQLAlchemy has configured its mappers, which the first query does. Without agents nothing
    # queries before Nova's first list_ports, which then fails with AttributeError.
    from sqlalchemy import orm
    orm.configure_mappers()
