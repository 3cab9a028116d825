"""CorGradSRModel: BasicSR's SRModel trained with CorGrad (multi-source gradient surgery).

Selected by ``ldt: {method: corgrad}`` (with ``model_type: LDTSRModel``, so a study can switch
methods by overriding the ``ldt:`` block alone) or directly by ``model_type: CorGradSRModel``.
The method is ``basicsr_ldt/corgrad/algorithm.py`` (plain PyTorch); this adapter checks the source cameras,
asks the training loop for camera-balanced batches, splits each batch by camera and hands CorGrad
one loss per camera. Checkpoints are a plain network (no composite), like FT.
"""
import dataclasses
import math
from collections import OrderedDict
from typing import Dict, List, Tuple

import torch

from basicsr.models.sr_model import SRModel
from basicsr.utils import get_root_logger
from basicsr.utils.registry import DATASET_REGISTRY, MODEL_REGISTRY

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.options import registered
from basicsr_ldt.corgrad import CorGrad, CorGradConfig
from basicsr_ldt.data.sampler import dataset_cameras
from basicsr_ldt.ldt import LDTConfig
from basicsr_ldt.models.best import BestCheckpointMixin
from basicsr_ldt.models.ema_decay import rescale_ema_decay, scaled_ema_decay
from basicsr_ldt.models.guarded_step import GuardedStepMixin
from basicsr_ldt.models.optimizers import AdamBuilderMixin
from basicsr_ldt.models.resumable import ResumableMixin
from basicsr_ldt.models.validation import ValidationMixin


def trains_corgrad(opt: Dict) -> bool:
    """Whether the options train CorGrad: its model type, or ``LDTSRModel`` with ``ldt.method: corgrad``."""
    return opt.get('model_type') == 'CorGradSRModel' or (opt.get('ldt') or {}).get('method') == 'corgrad'


def corgrad_config_from_options(opt: Dict) -> Tuple[CorGradConfig, List[str]]:
    """``CorGradConfig`` from the ``ldt:`` block (``method: corgrad`` plus CorGrad's keys), and the
    LDT keys of the block that CorGrad does not use.

    LDT keys are tolerated (and logged as ignored) because a study switches an LDT option file to
    CorGrad by overriding ``ldt.method`` alone; a key known to neither method still fails.
    """
    section = dict(opt.get('ldt') or {})
    section.pop('method', None)
    ours = {f.name for f in dataclasses.fields(CorGradConfig)}
    ignored = sorted(k for k in section if k not in ours and k in {f.name for f in dataclasses.fields(LDTConfig)})
    ours_given = {k: v for k, v in section.items() if k not in ignored}
    ours_given.setdefault('seed', int(opt.get('manual_seed') or 0))   # each study seed its own camera orders
    try:
        return CorGradConfig.from_dict(ours_given), ignored
    except ValueError as err:  # typed checks already name 'ldt.<key>'
        raise InputError(str(err) if str(err).startswith('ldt.') else f'ldt: {err}') from None


def describe_corgrad(config: CorGradConfig, cameras: List[str], ignored: List[str]) -> str:
    """The log's line on the run's CorGrad. On two cameras alpha is logged every iteration and never
    used (no gradient is ever dominant: norm - mean equals the std), so the line says so."""
    unused = ('; with two source cameras no gradient is ever dominant, so alpha and its decay change nothing'
              if len(cameras) == 2 else '')
    return (f'CorGrad over source cameras {cameras}: {config.slices} slices per layer, alpha {config.alpha} (decay '
            f'{config.decay}){unused}, {config.corgrad_variant} variant, camera-balanced batches'
            + (f'; LDT options ignored by CorGrad: {", ".join(ignored)}' if ignored else ''))


def refuse_unread_alpha(config: CorGradConfig, cameras: List[str]) -> None:
    """On two source cameras no gradient is ever dominant (norm - mean equals the std), so alpha and its
    decay are never read: a value other than the default (a sweep over it) would train one run twice."""
    if len(cameras) != 2:
        return
    default = CorGradConfig(corgrad_variant=config.corgrad_variant)
    for key, value, expected in (('alpha', config.alpha, default.alpha), ('alpha_decay', config.decay, default.decay)):
        if value != expected:
            raise InputError(f'ldt.{key}: {value!r} changes nothing on two source cameras {cameras}: no gradient is '
                             f'ever dominant there (norm - mean equals the std), so alpha and its decay are never '
                             'used; remove it, or train on three or more cameras')


def source_cameras(opt: Dict, train_set) -> List[str]:
    """The training data's cameras; fewer than two, or a batch too small to hold each, is bad input
    (checked by the model and, before the run makes anything, by ``option_values``)."""
    try:
        cameras = sorted(set(dataset_cameras(train_set)))
    except ValueError as err:
        raise InputError(f'datasets.train: {err}') from None
    if len(cameras) < 2:
        raise InputError(f'datasets.train.cameras: CorGrad needs at least two source cameras (one gradient per '
                         f'camera), the training data has {cameras}')
    batch = int(opt['datasets']['train']['batch_size_per_gpu'])
    if batch < len(cameras):
        raise InputError(f'datasets.train.batch_size_per_gpu: {batch} is smaller than the {len(cameras)} source '
                         'cameras; CorGrad needs every camera in every batch')
    return cameras


@MODEL_REGISTRY.register()
class CorGradSRModel(ValidationMixin, BestCheckpointMixin, GuardedStepMixin, ResumableMixin, AdamBuilderMixin,
                     SRModel):
    """SR model whose every step is one CorGrad update over a batch holding every source camera."""

    compile_auto_untimed = "CorGrad's step"   # the GPU run of 2026-11-28 timed the FT step compiled, not this

    #: read by the training loop (``basicsr_ldt.pipelines.train``): every batch must hold every camera
    camera_balanced_batches = True

    def init_training_settings(self) -> None:
        self.corgrad_config, ignored = corgrad_config_from_options(self.opt)
        self.source_cameras = self._check_source_cameras()
        scaled = scaled_ema_decay(self.opt['train'])
        super().init_training_settings()
        rescale_ema_decay(self, scaled)
        if self.precision.dtype is torch.float16:
            raise InputError('train.amp: CorGrad compares unscaled per-camera gradients; use bf16 or none, not fp16')
        # reached through ldt.method: corgrad on an LDTSRModel file, which may set train.cuda_graph
        self.step_graph_wanted('', unrecorded="CorGrad's step is not recorded (FTSRModel's step and LDT's dual step are)")
        self.corgrad = CorGrad(self.net_g, self.optimizer_g, self.corgrad_config, int(self.opt['train']['total_iter']))
        get_root_logger().info(describe_corgrad(self.corgrad_config, self.source_cameras, ignored))

    def _check_source_cameras(self) -> List[str]:
        train_opt = self.opt['datasets']['train']
        dataset_cls = registered(DATASET_REGISTRY, train_opt.get('type'), 'datasets.train.type')
        return source_cameras(self.opt, dataset_cls(dict(train_opt)))

    def feed_data(self, data: Dict) -> None:
        super().feed_data(data)
        self.batch_cameras = list(data.get('camera', []))

    def optimize_parameters(self, current_iter: int) -> None:
        groups = [[i for i, c in enumerate(self.batch_cameras) if c == camera] for camera in self.source_cameras]
        if any(not g for g in groups) or sum(map(len, groups)) != len(self.batch_cameras):
            raise RuntimeError(f'iteration {current_iter}: the batch holds cameras {sorted(set(self.batch_cameras))}, '
                               f'CorGrad needs each of {self.source_cameras} (camera-balanced sampler not used?)')
        losses = [self._camera_loss(torch.tensor(g, device=self.lq.device)) for g in groups]
        penalty = (lambda network: self.l2_sp(self.get_bare_model(network))) if self.l2_sp is not None else None
        logs = self.corgrad.step(losses, current_iter, self.precision, penalty)
        if 'l_penalty' in logs:
            logs['l_l2sp'] = logs.pop('l_penalty')
        self.log_dict = self.reduce_loss_dict(OrderedDict((k, torch.tensor(v)) for k, v in logs.items()))
        stepped = math.isfinite(logs['l_corgrad'])
        if stepped and self.ema_decay > 0:
            self.model_ema(decay=self.ema_decay)
        self.record_step(current_iter, None if stepped else 'CorGrad')

    def _camera_loss(self, index: torch.Tensor):
        lq, gt = self.lq.index_select(0, index), self.gt.index_select(0, index)
        return lambda network: sum(self.sr_losses(network(lq), gt).values())
