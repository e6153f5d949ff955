"""Bounded waits."""

import time


def wait(what, timeout, probe, interval=1.0):
    """``probe()``'s first true result, polled every ``interval`` seconds; TimeoutError naming
    ``what`` once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError('%s: not within %d s' % (what, timeout))
        time.sleep(interval)
