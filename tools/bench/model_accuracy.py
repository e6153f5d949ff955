#!/usr/bin/env python3
"""Boot-time model accuracy (docs/scheduling.md): run as root from a checkout.

    sudo .venv/bin/python tools/bench/model_accuracy.py run
    .venv/bin/python tools/bench/model_accuracy.py report results/model-accuracy.csv --plot out.png
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent.parent))

from yolo_bench import accuracy  # noqa: E402

if __name__ == '__main__':
    sys.exit(accuracy.main())
