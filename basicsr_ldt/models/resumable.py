"""What every model of this project adds to BasicSR's saving and resuming.

BasicSR 1.4.2 writes checkpoints in place (a kill mid-write destroys them), loads training
states onto CUDA only, and keeps no random-number state, so a resumed run drifts from an
uninterrupted one. The mixin fixes all three without touching BasicSR.
"""
import copy
import os
import random
from typing import Any, Dict, List, Optional

import numpy as np
import torch
import torch.distributed as dist

from basicsr.utils import get_root_logger
from basicsr.utils.dist_util import master_only

from basicsr_ldt.ldt.typed import MISSING, lookup
from basicsr_ldt.weights.checkpoint import describe_unloaded, load_weights, save_atomic


def training_cameras(opt: Dict[str, Any]) -> Optional[List[str]]:
    """The source cameras ``datasets.train.cameras`` names (None: every camera of the folders), as a
    training state records them: a run resumed on other cameras would mix two trainings under one name."""
    cameras = opt['datasets']['train'].get('cameras')
    return [cameras] if isinstance(cameras, str) else None if cameras is None else [str(c) for c in cameras]


#: Options a training state fixes: on a resume BasicSR restores the optimizer's and scheduler's own state (the
#: file's lr, betas, milestones are not read again) and the random state (a new ``manual_seed`` is not used), and
#: the data draws continue where they were (other crops or batches would mix two data streams under one name):
#: a value changed there would be logged as used and ignored. Values read afresh at each build (the loss, EMA,
#: L2-SP, ``max_bad_steps``) and execution choices (``optim_g.fused``/``foreach``, workers, compile, precision)
#: may change; ``total_iter`` may grow (a run extended). ``model_type``: the state holds that model's optimizers and
#: method state (an LDT-S state resumed as FT went on as plain FT in the LDT-S run's folder).
RESUME_FIXED = ('model_type', 'scale', 'manual_seed', 'train.optim_g', 'train.scheduler', 'datasets.train.gt_size',
                'datasets.train.batch_size_per_gpu', 'datasets.train.use_hflip', 'datasets.train.use_rot',
                'datasets.train.dataset_enlarge_ratio', 'datasets.train.subset', 'datasets.train.cameras')
EXECUTION_ONLY = ('fused', 'foreach')


def resume_fixed(opt: Dict[str, Any]) -> Dict[str, Any]:
    """The values of ``RESUME_FIXED`` in ``opt`` (absent keys as None), as a training state records them."""
    values = {}
    for dotted in RESUME_FIXED:
        value = lookup(opt, dotted)
        value = None if value is MISSING else value
        if dotted == 'train.optim_g' and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in EXECUTION_ONLY}
        values[dotted] = copy.deepcopy(value)
    return values


def unsaved_states_warning(opt: Dict[str, Any]) -> Optional[str]:
    """The log's warning when no training state will ever be written: BasicSR saves states every
    ``logger.save_checkpoint_freq`` iterations and only the final network at the end, so an
    interrupted run could not resume and ``--auto_resume`` would start it again from iteration 1."""
    freq, total = (opt.get('logger') or {}).get('save_checkpoint_freq'), (opt.get('train') or {}).get('total_iter')
    if isinstance(freq, int) and isinstance(total, int) and freq > total:
        return (f'logger.save_checkpoint_freq {freq} is above train.total_iter {total}: no training state will be '
                'saved, so an interrupted run starts again from iteration 1 (only the final network is written)')
    return None


def rng_state() -> Dict[str, Any]:
    """Python, NumPy and torch generator states, in a form ``weights_only`` loading accepts."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {'python': random.getstate(), 'numpy': [kind, torch.from_numpy(keys.copy()), pos, has_gauss, gauss],
             'torch': torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    """Inverse of :func:`rng_state`."""
    version, internal, gauss = state['python']
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, gauss = state['numpy']
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, gauss))
    torch.set_rng_state(state['torch'])
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])


class ResumableMixin:
    """Atomic ``net_*.pth`` and ``*.state`` files; training states that also hold RNG state and
    whatever :meth:`extra_training_state` returns (a subclass's method state)."""

    def __init__(self, opt: Dict[str, Any]) -> None:
        self.fixed_options = resume_fixed(opt)   # before BasicSR's setup pops optim_g.type and scheduler.type
        super().__init__(opt)

    def model_to_device(self, net):
        # BasicSR's DDP wrapper pins a CUDA device; on CPU (gloo) DDP takes no device ids.
        if self.opt['dist'] and self.device.type == 'cpu':
            from torch.nn.parallel import DistributedDataParallel
            return DistributedDataParallel(net.to(self.device),
                                           find_unused_parameters=self.opt.get('find_unused_parameters', False))
        return super().model_to_device(net)

    @master_only
    def save_network(self, net, net_label, current_iter, param_key='params'):
        label = 'latest' if current_iter == -1 else current_iter
        nets = net if isinstance(net, list) else [net]
        keys = param_key if isinstance(param_key, list) else [param_key]
        payload = {}
        for one, key in zip(nets, keys):
            state = self.get_bare_model(one).state_dict()
            payload[key] = {k[7:] if k.startswith('module.') else k: v.detach().cpu() for k, v in state.items()}
        save_atomic(payload, os.path.join(self.opt['path']['models'], f'{net_label}_{label}.pth'))

    def load_network(self, net, load_path, strict=True, param_key='params'):
        loaded = load_weights(self.get_bare_model(net), load_path, param_key, strict)
        get_root_logger().info(f'Loaded {type(self.get_bare_model(net)).__name__} from {load_path} '
                               f"[{loaded.key or 'a bare state dict'}]" + describe_unloaded(loaded, self.get_bare_model(net)))

    def replica_tensors(self) -> List[torch.Tensor]:
        """Tensors every rank must hold identically (checked at each checkpoint under torchrun)."""
        return list(self.get_bare_model(self.net_g).parameters())

    def check_replicas_agree(self, current_iter: int) -> None:
        """Under torchrun, fail loudly if the ranks' weights diverged instead of saving rank 0's copy
        of a silently broken run; logs the check so users see it held."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return
        # One sum per tensor, gathered where the process group can reduce it: the tensors may sit on
        # different devices (CUDA weights beside the CPU-built DPU coefficients), and NCCL reduces
        # only CUDA tensors, Gloo CPU ones.
        device = torch.device('cuda', torch.cuda.current_device()) if dist.get_backend() == 'nccl' else 'cpu'
        with torch.no_grad():
            fingerprint = torch.stack([t.detach().double().sum().to(device) for t in self.replica_tensors()])
            low, high = fingerprint.clone(), fingerprint.clone()
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
        if not torch.equal(low, high):
            raise RuntimeError(f'ranks hold different weights at iteration {current_iter} '
                               f'({int((low != high).sum())} tensors differ)')
        get_root_logger().info(f'replicas identical on {dist.get_world_size()} ranks at iteration {current_iter}')

    def check_savable(self, current_iter: int) -> None:
        """Refuse to write weights holding NaN/inf (the last checkpoint stays the newest good one),
        and under torchrun weights that differ between ranks."""
        tensors = self.replica_tensors()
        if getattr(self, 'net_g_ema', None) is not None:
            tensors += list(self.net_g_ema.parameters())
        bad = sum(1 for t in tensors if t.is_floating_point() and not bool(torch.isfinite(t).all()))
        if bad:
            raise FloatingPointError(f'{bad} weight tensors hold NaN/inf at iteration {current_iter}: not saving '
                                     'them; training stopped, the last saved checkpoint is intact')
        self.check_replicas_agree(current_iter)

    def save(self, epoch, current_iter):
        self.check_savable(current_iter)
        super().save(epoch, current_iter)

    def extra_training_state(self) -> Dict[str, Any]:
        """Method state to store beside optimizers and schedulers; subclasses extend it."""
        return {}

    def load_extra_training_state(self, state: Dict[str, Any]) -> None:
        """Inverse of :meth:`extra_training_state`."""

    @master_only
    def save_training_state(self, epoch, current_iter):
        if current_iter == -1:
            return
        state = {'epoch': epoch, 'iter': current_iter,
                 'optimizers': [o.state_dict() for o in self.optimizers],
                 'schedulers': [s.state_dict() for s in self.schedulers],
                 'rng': rng_state(), 'extra': self.extra_training_state(),
                 'train_cameras': training_cameras(self.opt), 'fixed_options': self.fixed_options}
        save_atomic(state, os.path.join(self.opt['path']['training_states'], f'{current_iter}.state'))

    def resume_training(self, resume_state):
        self.load_extra_training_state(resume_state.get('extra', {}))
        super().resume_training(resume_state)
        if 'rng' in resume_state:
            set_rng_state(resume_state['rng'])
        else:
            get_root_logger().warning('training state has no RNG state: the resumed run will not repeat '
                                      'the random draws of an uninterrupted one')
