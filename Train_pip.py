"""Train an SR network: ``python Train_pip.py -opt options/train_mambair_ldt.yml [--auto_resume]``.

Accepts every flag of BasicSR's ``basicsr/train.py`` (``--launcher``, ``--auto_resume``, ``--debug``,
``--force_yml``, ``--local_rank``); outputs go to ``experiments/<name>/``.
"""
from os import path as osp

import basicsr_ldt  # noqa: F401  (registers archs, datasets and models; must precede basicsr)
from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.outputs import fail
from basicsr_ldt.pipelines.train import train_pipeline

if __name__ == '__main__':
    try:
        train_pipeline(osp.dirname(osp.abspath(__file__)))
    except InputError as err:
        fail(str(err))
    except FloatingPointError as err:
        fail(str(err), code=3)
