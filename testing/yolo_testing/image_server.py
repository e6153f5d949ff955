"""Glance's image download, emulated for tests and benchmarks of first boots (docs/first-boot.md).

``GET /v2/images/ID/file`` answers an image's data whole or, for a single ``Range`` (``bytes=A-B``
or ``bytes=A-``), with 206 and those bytes, as Glance's download does. Every connection shares one
link of ``rate`` bytes per second (0: unthrottled), as a compute host's downloads share its
network (``throttle_ranges`` false: only downloads from an offset to the end use it); a test can
cut the next whole download after some bytes (``break_after``), answer 503 to everything
(``down``), or 400 to ranges (``ranges_refused``), as Glance does where its store cannot serve them,
and hold every transfer before its next chunk (``pause``, ``resume``) to order events around it.
"""

import http.server
import os
import re
import threading
import time

CHUNK = 256 << 10
PAUSE_LIMIT_SECONDS = 120     # a test that never resumes does not hang its senders


class Link:
    """A link of ``rate`` bytes per second shared by every sender: each chunk takes the next
    free slot of its length on it and is sent at its end."""

    def __init__(self, rate=0):
        self.rate = rate
        self._free_at = time.monotonic()
        self._lock = threading.Lock()

    def take(self, nbytes):
        rate = self.rate
        if not rate:
            return
        with self._lock:
            start = max(time.monotonic(), self._free_at)
            self._free_at = start + nbytes / rate
            done = self._free_at
        time.sleep(max(0.0, done - time.monotonic()))


class ImageServer(http.server.ThreadingHTTPServer):
    """The images ``{image id: path}``, on 127.0.0.1 (``endpoint``), over one :class:`Link`.
    Use as a context manager: it serves on a thread of its own meanwhile."""

    daemon_threads = True

    def __init__(self, images, rate=0):
        super().__init__(('127.0.0.1', 0), ImageHandler)
        self.images = {image_id: str(path) for image_id, path in images.items()}
        self.link = Link(rate)
        self.throttle_ranges = True
        self.break_after = None
        self.down = False
        self.ranges_refused = False     # as Glance on its rbd, swift, s3 and http stores
        self.token_expired = False      # new requests get 401; those under way go on
        self.ranges = []        # (start, end) of each ranged request, in order
        self._flowing = threading.Event()
        self._flowing.set()

    def pause(self):
        self._flowing.clear()

    def resume(self):
        self._flowing.set()

    @property
    def rate(self):
        return self.link.rate

    @rate.setter
    def rate(self, rate):
        self.link.rate = rate

    @property
    def endpoint(self):
        return 'http://127.0.0.1:%d' % self.server_address[1]

    def __enter__(self):
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc_info):
        self.resume()
        self.shutdown()
        self.server_close()


class ImageHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def log_message(self, *args):
        pass

    def do_GET(self):
        server = self.server
        match = re.fullmatch(r'/v2/images/([^/]+)/file', self.path)
        path = server.images.get(match.group(1)) if match else None
        if server.down or path is None:
            self.send_error(503 if server.down else 404)
            return
        if server.token_expired:
            self.send_error(401, 'The request you have made requires authentication.')
            return
        size = os.path.getsize(path)
        start, end = 0, size
        ranged = re.fullmatch(r'bytes=(\d+)-(\d*)', self.headers.get('Range', ''))
        if ranged and server.ranges_refused:
            self.send_error(400, 'Range requests are not supported by this store')
            return
        if ranged:
            start = int(ranged.group(1))
            end = min(size, int(ranged.group(2)) + 1) if ranged.group(2) else size
            server.ranges.append((start, end))
            self.send_response(206)
            self.send_header('Content-Range', 'bytes %d-%d/%d' % (start, end - 1, size))
        else:
            self.send_response(200)
        self.send_header('Content-Length', str(end - start))
        self.end_headers()
        to_the_end = not (ranged and ranged.group(2))
        cut = None
        if to_the_end and server.break_after is not None:
            cut, server.break_after = start + server.break_after, None
        with open(path, 'rb') as data:
            for offset in range(start, end, CHUNK):
                if server.down or (cut is not None and offset >= cut):
                    self.close_connection = True
                    return
                if not server._flowing.wait(PAUSE_LIMIT_SECONDS):
                    self.close_connection = True    # the test's hold lapsed: fail loudly
                    return
                length = min(CHUNK, end - offset)
                if to_the_end or server.throttle_ranges:
                    server.link.take(length)
                self.wfile.write(os.pread(data.fileno(), length, offset))
