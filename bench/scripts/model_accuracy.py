#!/usr/bin/env python3
"""Boot-time model accuracy (docs/evaluation/scheduling-runs.md, "Model accuracy"): run as root
from a checkout.

    sudo .venv/bin/python bench/scripts/model_accuracy.py run
    .venv/bin/python bench/scripts/model_accuracy.py report results/model-accuracy.csv \
        --plot out.png
"""

import sys

import checkout  # noqa: F401 (makes the checkout importable)
from yolo_bench import accuracy  # noqa: I202

if __name__ == '__main__':
    sys.exit(accuracy.main())
