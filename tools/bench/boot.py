"""Runs yolo-boot-bench from a checkout (see yolo_bench/cli.py)."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from yolo_bench import cli  # noqa: E402

if __name__ == '__main__':
    cli.main()
