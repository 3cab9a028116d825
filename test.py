"""Evaluate checkpoints per camera: ``python test.py -opt options/test.yml``.

Prints the PSNR/SSIM table and writes ``results/<name>/metrics.{md,csv,json}``.
"""
from os import path as osp

import basicsr_ldt  # noqa: F401  (registers archs, datasets and models; must precede basicsr)
from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.outputs import fail
from basicsr_ldt.pipelines.evaluate import test_pipeline

if __name__ == '__main__':
    try:
        test_pipeline(osp.dirname(osp.abspath(__file__)))
    except InputError as err:
        fail(str(err))
