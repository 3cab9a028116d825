#!/usr/bin/env python
"""Released weights: ``python scripts/fetch_weights.py MambaIR_SR_x4 HAT_SRx4 SAFMN_DF2K_x4`` (``--list``).

Downloads each into pretrained/<name>.pth (where the option files look), keeps it only when it
loads strictly into its network, and pins its SHA-256 in pretrained/weights.lock; the logic is
basicsr_ldt/weights/fetch.py.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import basicsr_ldt  # noqa: E402,F401  (registers archs; must precede basicsr)
from basicsr_ldt.weights.fetch import main  # noqa: E402

if __name__ == '__main__':
    sys.exit(main())
