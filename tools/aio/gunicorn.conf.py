"""gunicorn settings shared by the all-in-one cloud's API services (one worker each)."""
import sys

workers = 1
worker_class = 'gthread'
threads = 4
timeout = 600
graceful_timeout = 30
accesslog = '-'
errorlog = '-'


def post_fork(server, worker):
    # The OpenStack WSGI applications parse sys.argv with oslo.config when they are loaded,
    # which happens after this in the worker: gunicorn's own arguments are not theirs.
    del sys.argv[1:]
