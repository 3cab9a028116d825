"""Validation during training runs the network as ``test.py`` does, for every model type.

BasicSR's ``SRModel.test`` runs each validation image whole, in fp32: on DRealSR's full-size
photographs a MambaIR or HAT forward of that size is what runs out of GPU memory, and it is not
how the official LDT code validates (``Tools/Test_tool.py`` ``SR_slice`` cuts every image into
sections). Here ``val:`` takes ``test:``'s inference keys (``tile_mode``, ``tile_size``,
``tile_overlap``, ``precision``; basicsr_ldt.inference.settings), and the whole ``val:`` section
is checked when the model is built, before the first iteration, so a misspelt key or a bad value
stops the run with one line instead of at the first validation hours later.

BasicSR's training loop validates at every multiple of ``val_freq`` and once more after the loop,
at the same iteration: with ``total_iter`` a multiple of ``val_freq`` the last weights were
validated twice (minutes on full-size photographs), logged, written to tensorboard and offered to
the best-checkpoint selection twice. A validation set is therefore run once per iteration: asked
again for the iteration it last ran at, the model logs one line and keeps that run's results.
A training step always moves to a new iteration, so the same iteration means the same weights.
"""
from typing import Any, Dict, Optional, Sequence, Tuple

import torch
from torch import nn

from basicsr.utils import get_root_logger

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.common.metric_crop import check_crop_border
from basicsr_ldt.common.options import check_known_keys
from basicsr_ldt.common.schema import section_keys
from basicsr_ldt.inference.settings import InferenceSettings, inference_settings
from basicsr_ldt.inference.tiling import run_inference
from basicsr_ldt.ldt.typed import boolean, check_options, mapping, optional, whole

#: Types of the ``val:`` keys BasicSR 1.4.2 reads in training (which keys ``val:`` takes: the schema).
#: ``val_freq`` whole: BasicSR validates where ``current_iter % val_freq == 0`` (1.5 meant every 3rd).
BASICSR_VAL_SPECS = {'val_freq': whole(1), 'save_img': boolean(), 'pbar': boolean(),
                     'metrics': optional(mapping(mapping()))}
VAL_KEYS = section_keys('val')


def basicsr_device_type(num_gpu: int) -> str:
    """The device type BasicSR's ``BaseModel`` trains and validates on: CUDA for any ``num_gpu`` but 0."""
    return 'cuda' if num_gpu != 0 else 'cpu'


def validation_settings(opt: Dict) -> InferenceSettings:
    """Check the ``val:`` section (unknown keys, BasicSR's and the inference keys' values) and
    return how validation runs the network."""
    val = opt.get('val')
    if val is None:
        val = {}
    elif not isinstance(val, dict):
        raise InputError(f'val: expected a mapping of validation options, got {val!r}')
    check_known_keys('val', val, VAL_KEYS)
    check_options('val', val, BASICSR_VAL_SPECS, InputError)
    settings = inference_settings('val', val, basicsr_device_type(opt.get('num_gpu', 0)))
    if settings.tile_mode != 'whole' and not isinstance(opt.get('scale'), int):
        raise InputError(f"scale: val.tile_mode {settings.tile_mode!r} pastes tiles at the network's scale; give the "
                         f"top-level 'scale' (an integer), got {opt.get('scale')!r}")
    return settings


def check_validation_crops(opt: Dict, val_sets: Sequence[Tuple[Dict, Any]]) -> None:
    """Each ``val.metrics`` crop against the smallest image of each validation set whose sizes were
    read: BasicSR would log NaN for every validation of the run (SSIM over fewer pixels than its window)."""
    for name, metric in ((opt.get('val') or {}).get('metrics') or {}).items():
        if 'crop_border' not in (metric or {}):
            continue
        for _, dataset in val_sets:
            smallest = getattr(dataset, 'smallest_hr', None)
            if smallest is not None:
                check_crop_border(f'val.metrics.{name}.crop_border', metric['crop_border'], metric.get('type'),
                                  *smallest)


class ValidationMixin:
    """``test()`` (what BasicSR's validation calls per image) through the shared inference path.

    ``inference_network`` is the network validated: BasicSR's choice (``net_g_ema`` when kept,
    else ``net_g``); LDT overrides it with the composite or the branch ``val.best_network`` names.
    ``validation`` runs each validation set once per iteration (see the module docstring).
    """

    def __init__(self, opt: Dict) -> None:
        self.validation_inference = validation_settings(opt)
        #: Per validation set (its ``name``): the iteration it was last validated at and the metric
        #: results of that run (``None`` where BasicSR computed none, e.g. on ranks other than 0).
        self.last_validation: Dict[str, Tuple[int, Optional[Dict[str, Any]]]] = {}
        super().__init__(opt)
        if opt.get('val') is not None:
            get_root_logger().info(f'Validation inference: {self.validation_inference.describe()}')

    def validation(self, dataloader, current_iter, tb_logger, save_img=False):
        name = dataloader.dataset.opt['name']
        last = self.last_validation.get(name)
        if last is not None and last[0] == current_iter:
            if last[1] is not None:
                self.metric_results = dict(last[1])
            get_root_logger().info(f'Validation {name}: iteration {current_iter} was validated already, with no '
                                   'training step since; not repeated')
            return
        super().validation(dataloader, current_iter, tb_logger, save_img)
        results = getattr(self, 'metric_results', None)
        self.last_validation[name] = (current_iter, None if results is None else dict(results))

    def inference_network(self) -> nn.Module:
        return self.net_g_ema if hasattr(self, 'net_g_ema') else self.net_g

    def test(self) -> None:
        network = self.inference_network()
        was_training = network.training
        network.eval()
        try:
            with torch.no_grad():
                self.output = run_inference(network, self.lq, self.opt.get('scale', 1), self.validation_inference)
        finally:
            network.train(was_training)
