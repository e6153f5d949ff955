import os
import sys

import setuptools

# setup.cfg's [global] commands names yolo_build, beside this file.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

setuptools.setup(setup_requires=['pbr>=6.0.0'], pbr=True)
