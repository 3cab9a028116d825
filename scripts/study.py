#!/usr/bin/env python
"""Seeded studies: ``python scripts/study.py -opt options/study/demo.yml [--dry-run|--commands FILE|--collect]``.

Trains and tests one run per (method, sweep point, seed) with Train_pip.py and test.py, skips
finished runs, resumes interrupted ones, and writes results/<study>/study.{json,md,csv,png}.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import basicsr_ldt  # noqa: E402,F401  (registers archs, datasets and models; must precede basicsr)
from basicsr_ldt.study.cli import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main(ROOT))
