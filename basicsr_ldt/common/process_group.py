"""``--launcher pytorch`` on CPU machines too.

BasicSR's ``init_dist`` always selects a CUDA device and the NCCL backend, so ``torchrun ...
--launcher pytorch`` dies on a machine without GPUs. Here the process group is started with
NCCL when every local rank has a GPU of its own and Gloo otherwise (CPU machines, or more ranks
than GPUs: NCCL refuses two ranks on one GPU). ``basicsr_ldt.common.option_file.parse_options``
starts it, after the option file was read and checked.
"""
import os
import sys

import torch
import torch.distributed as dist


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
