"""``train.ema_reference_iters``: BasicSR's weight EMA (``train.ema_decay``) scaled to the run.

Used by the model types that keep BasicSR's EMA (``FTSRModel``, ``CorGradSRModel``); LDT's own EMA
scales with ``ldt.ema_reference_iters`` (``basicsr_ldt.ldt.ema_horizon``, whose formula this is).
"""
from typing import Dict, Optional

from basicsr.models.sr_model import SRModel
from basicsr.utils import get_root_logger

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.ldt.ema_horizon import horizon, scaled_coefficient


def scaled_ema_decay(train_opt: Dict) -> Optional[float]:
    """``train.ema_decay`` rescaled to this run by ``train.ema_reference_iters`` (None: not asked).

    BasicSR's weight EMA moves once per iteration, so a decay written for R iterations averages
    over the same share of a T-iteration run with decay' = 1 - (1 - decay) R / T (the scaled
    eq. 8 of ``basicsr_ldt.ldt.ema_horizon``, E_ref = R, E_run = T).
    """
    decay = train_opt.get('ema_decay', 0)
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 <= decay < 1:
        raise InputError(f'train.ema_decay: expected a number in [0, 1) (0: no weight EMA), got {decay!r}')
    reference = train_opt.get('ema_reference_iters')
    if reference is None:
        return None
    if isinstance(reference, bool) or not isinstance(reference, int) or reference < 1:
        raise InputError(f'train.ema_reference_iters: expected an integer >= 1 (the run length train.ema_decay '
                         f'was written for), got {reference!r}')
    if not decay:
        raise InputError(f'train.ema_reference_iters: rescales train.ema_decay, which is not set (got '
                         f'ema_decay {decay!r}); remove ema_reference_iters or set ema_decay')
    total = int(train_opt['total_iter'])
    scaled = scaled_coefficient(float(decay), reference, total)
    if scaled <= 0.0:
        raise InputError(f'train.ema_reference_iters: ema_decay {decay} written for {reference} iterations averages '
                         f'over {horizon(float(decay)):.0f} of them; a {total}-iteration run cannot average over '
                         'that share (the rescaled decay would be <= 0, which BasicSR reads as no EMA)')
    return scaled


def rescale_ema_decay(model: SRModel, scaled: Optional[float]) -> None:
    """After ``SRModel.init_training_settings``: use the rescaled decay and log it, or warn when the
    decay as given averages over more iterations than the run has (the trap the option removes)."""
    train_opt, logger = model.opt['train'], get_root_logger()
    if scaled is not None:
        logger.info(f"EMA decay {model.ema_decay} (written for train.ema_reference_iters "
                    f"{train_opt['ema_reference_iters']}) rescaled to {scaled:.6g} for {train_opt['total_iter']} "
                    'iterations')
        model.ema_decay = scaled
    elif model.ema_decay > 0 and horizon(model.ema_decay) > int(train_opt['total_iter']):
        logger.warning(f"EMA decay {model.ema_decay} averages over {horizon(model.ema_decay):.0f} iterations, more than "
                       f"the {train_opt['total_iter']} of this run: the EMA weights stay near the start. Set "
                       'train.ema_reference_iters to the run length the decay was written for to rescale it to '
                       'this run')
