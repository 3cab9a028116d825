"""Option parsing that starts ``--launcher pytorch`` on CPU machines too.

BasicSR's ``init_dist`` always selects a CUDA device and the NCCL backend, so ``torchrun ...
--launcher pytorch`` dies on a machine without GPUs. Here the process group is started with
NCCL when every local rank has a GPU of its own and Gloo otherwise (CPU machines, or more ranks
than GPUs: NCCL refuses two ranks on one GPU); everything else is BasicSR's ``parse_options``.
"""
import os
import sys
from typing import Dict, Tuple

import torch
import torch.distributed as dist

from basicsr.utils import set_random_seed
from basicsr.utils.dist_util import get_dist_info
from basicsr.utils.options import parse_options


def _pop_launcher(argv: list) -> str:
    """Remove ``--launcher X`` / ``--launcher=X`` from ``argv`` and return X (default 'none')."""
    launcher = 'none'
    for i, arg in enumerate(list(argv)):
        if arg == '--launcher' and i + 1 < len(argv):
            launcher = argv[i + 1]
            del argv[i:i + 2]
            break
        if arg.startswith('--launcher='):
            launcher = arg.split('=', 1)[1]
            del argv[i]
            break
    return launcher


def start_process_group() -> None:
    """``init_process_group`` from torchrun's environment, on GPUs or CPUs."""
    if torch.cuda.is_available():
        gpus, ranks = torch.cuda.device_count(), int(os.environ.get('LOCAL_WORLD_SIZE', 1))
        torch.cuda.set_device(int(os.environ.get('LOCAL_RANK', 0)) % gpus)
        if ranks > gpus and int(os.environ.get('LOCAL_RANK', 0)) == 0:
            print(f'{ranks} ranks share {gpus} GPU(s): NCCL needs one GPU per rank, using the Gloo backend',
                  file=sys.stderr, flush=True)
        dist.init_process_group(backend='nccl' if ranks <= gpus else 'gloo')
    else:
        dist.init_process_group(backend='gloo')


def end_process_group() -> None:
    """Wait for every rank, then shut the process group down.

    Ranks other than 0 skip validation and would otherwise exit while rank 0 still works; a
    process that exits with Gloo's threads still running can abort ("terminate called without
    an active exception"), which torchrun reports as a failed run.
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def parse_training_options(root_path: str, is_train: bool = True) -> Tuple[Dict, object]:
    """``basicsr.utils.options.parse_options`` with a CPU-capable ``--launcher pytorch``."""
    argv = sys.argv
    launcher = _pop_launcher(argv)
    if launcher != 'pytorch':
        if launcher != 'none':
            argv += ['--launcher', launcher]  # slurm: BasicSR's own initialisation
        return parse_options(root_path, is_train=is_train)
    if not (dist.is_available() and dist.is_initialized()):
        start_process_group()
    opt, args = parse_options(root_path, is_train=is_train)
    args.launcher = 'pytorch'
    opt['dist'] = True
    opt['rank'], opt['world_size'] = get_dist_info()
    set_random_seed(opt['manual_seed'] + opt['rank'])
    return opt, args
