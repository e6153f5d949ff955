"""What YOLO's tests and benchmarks share, and the product does not ship: waits, an image
server, commands in guests through their agent, and the all-in-one cloud's layout."""

import os
import pathlib

# The checkout this package runs from (it is used from a checkout, never installed apart).
REPO = pathlib.Path(__file__).resolve().parents[2]
# Its yolofs build (tools/build-yolofs.sh), unless YOLOFS_BIN names another.
if (REPO / 'yolofs' / 'target' / 'release' / 'yolofs').exists():
    os.environ.setdefault('YOLOFS_BIN', str(REPO / 'yolofs' / 'target' / 'release' / 'yolofs'))
