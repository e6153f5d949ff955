"""Lets the scripts beside it run from a checkout: the product, the benchmarks and the test
support importable ahead of any installed copy, and the checkout's yolofs build used unless
YOLOFS_BIN names another."""

import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
for path in (REPO, REPO / 'bench', REPO / 'testing'):
    sys.path.insert(0, str(path))
import yolo_testing  # noqa: E402,F401 (the checkout's yolofs build)
