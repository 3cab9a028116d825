"""What every model type of this project adds to a training step: mixed precision, surviving a
non-finite loss, and the network's blocks compiled when ``train.compile`` says so
(``compiled_blocks``, a base of the mixin).

``train: amp`` (none | bf16 | fp16) runs forward and loss under autocast; fp16 adds loss
scaling (one GradScaler per optimizer, see ``basicsr_ldt.ldt.precision``). A NaN/inf loss
skips its step (no optimizer step, no EMA, no LDT exchange or profiling sample) with one log
line; ``train: max_bad_steps`` consecutive skipped steps stop the run, because a loss that stays
non-finite means the run is broken, not unlucky. The counter and the loss scalers are part of
the training state, so a resumed run continues exactly.
"""
import math
from collections import OrderedDict
from typing import Any, Dict, Optional

import torch

from basicsr.utils import get_root_logger

from basicsr_ldt.common.errors import InputError
from basicsr_ldt.ldt.pair import optimizer_step
from basicsr_ldt.ldt.precision import AMP_DTYPES, MixedPrecision, resolve_dtype, several_ranks
from basicsr_ldt.ldt.step_graph import BatchTerms, StepGraph
from basicsr_ldt.models.compiled_blocks import CompiledBlocksMixin
from basicsr_ldt.models.cuda_graph import graph_decision, graph_mode
from basicsr_ldt.models.l2_sp import build_l2_sp

#: Defaults of the ``train:`` keys this mixin reads (documented in docs/options.md).
STEP_DEFAULTS = {'amp': 'none', 'max_bad_steps': 10}


def precision_from_options(train_opt: Dict, device_type: str) -> MixedPrecision:
    """``MixedPrecision`` for ``train: amp``, refusing bad values before training starts."""
    value = train_opt.get('amp')
    try:
        dtype = resolve_dtype('train.amp', STEP_DEFAULTS['amp'] if value is None else value, AMP_DTYPES,
                              device_type)
    except ValueError as err:
        raise InputError(str(err)) from None
    return MixedPrecision(dtype, device_type)


def max_bad_steps_from_options(train_opt: Dict) -> int:
    value = train_opt.get('max_bad_steps', STEP_DEFAULTS['max_bad_steps'])
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f'train.max_bad_steps: expected an integer >= 1, got {value!r}')
    return value


class GuardedStepMixin(CompiledBlocksMixin):
    """Autocast/loss scaling and non-finite-loss skipping for BasicSR ``SRModel`` subclasses.

    Models that run their own step (``LDTSRModel``) call :meth:`setup_precision` in
    ``init_training_settings`` and :meth:`record_step` after each step.
    """

    #: Set by a model type whose replayed step no GPU run has timed: ``train.cuda_graph: auto`` leaves
    #: it eager; ``true`` still records it.
    graph_auto_untimed = ''

    def setup_precision(self) -> None:
        train_opt = self.opt['train']
        self.precision = precision_from_options(train_opt, self.device.type)
        self.max_bad_steps = max_bad_steps_from_options(train_opt)
        self.bad_steps = 0
        self.step_graph: Optional[StepGraph] = None
        if self.precision.dtype is not None:
            scaling = ', loss scaling with one GradScaler per optimizer' if self.precision.dtype is torch.float16 else ''
            get_root_logger().info(f"Mixed precision: autocast {train_opt['amp']}{scaling}; weights, gradients and "
                                   'optimizer state stay fp32')

    def setup_step_graph(self) -> None:
        """FTSRModel's step replayed as a CUDA graph or not (``train.cuda_graph``)."""
        self.step_graph = StepGraph(self.get_bare_model(self.net_g)) if self.step_graph_wanted('each step') else None

    def step_graph_wanted(self, recorded: str, unrecorded: str = '') -> bool:
        """``train.cuda_graph`` (``basicsr_ldt.models.cuda_graph``) decided for this run, with one log line
        saying which and why. ``recorded`` names what is replayed; ``unrecorded`` why nothing can be."""
        network = self.get_bare_model(self.net_g)
        single_process = network is self.net_g and not several_ranks()
        graph_on, reason = graph_decision(graph_mode(self.opt['train']), network, self.device.type,
                                          self.precision.dtype, single_process, self.graph_auto_untimed, unrecorded)
        get_root_logger().info(f'CUDA graph: the forward, loss and backward of {recorded} replayed as one graph after '
                               'the first steps' if graph_on else f'CUDA graph: off ({reason})')
        return graph_on

    def setup_l2_sp(self, trained_networks: int = 1) -> None:
        """``train.l2_sp_weight``: the L2-SP penalty toward the run's start (``l2_sp``), or None."""
        self.l2_sp = build_l2_sp(self.get_bare_model(self.net_g), self.opt, trained_networks)
        if self.l2_sp is not None:
            get_root_logger().info(f'L2-SP: (lambda / 2) ||theta - theta_start||^2 with lambda {self.l2_sp.weight:g} over '
                                   f'{len(self.l2_sp.names)} parameters of the start (logged as l_l2sp)')

    def add_l2_sp(self, network: torch.nn.Module, terms: Dict[str, torch.Tensor]) -> None:
        """The L2-SP penalty of ``network`` as ``terms['l_l2sp']`` when the run has one."""
        if getattr(self, 'l2_sp', None) is not None:
            terms['l_l2sp'] = self.l2_sp(self.get_bare_model(network))

    def init_training_settings(self) -> None:
        self.setup_precision()
        super().init_training_settings()
        self.setup_l2_sp()

    def optimize_parameters(self, current_iter: int) -> None:
        """BasicSR 1.4.2 ``SRModel.optimize_parameters`` under autocast, skipping non-finite losses."""
        def terms_of(network, lq, gt):
            self.output = network(lq)
            terms = self.sr_losses(self.output, gt)
            self.add_l2_sp(network, terms)
            return terms

        batch = BatchTerms(terms_of, self.lq, self.gt)
        # DDP (when running) averages gradients inside backward.
        loss = optimizer_step(self.net_g, self.optimizer_g, batch, self.precision, 'net_g', synchronise=False,
                              graph=self.step_graph)
        self.log_dict = self.reduce_loss_dict(OrderedDict((k, v.detach().float()) for k, v in batch.terms.items()))
        stepped = math.isfinite(loss)
        if stepped and self.ema_decay > 0:
            self.model_ema(decay=self.ema_decay)
        self.record_step(current_iter, None if stepped else 'fine-tuning')

    def sr_losses(self, output: torch.Tensor, gt: torch.Tensor) -> Dict[str, torch.Tensor]:
        """BasicSR ``SRModel``'s loss terms of one batch (pixel, perceptual, style; those configured)."""
        terms = OrderedDict()
        if self.cri_pix:
            terms['l_pix'] = self.cri_pix(output, gt)
        if self.cri_perceptual:
            l_percep, l_style = self.cri_perceptual(output, gt)
            for name, value in (('l_percep', l_percep), ('l_style', l_style)):
                if value is not None:
                    terms[name] = value
        return terms

    def record_step(self, current_iter: int, skipped: Optional[str]) -> None:
        """Count consecutive skipped steps; log each, stop at ``train.max_bad_steps``."""
        if skipped is None:
            self.bad_steps = 0
            return
        self.bad_steps += 1
        values = ', '.join(f'{k}={float(v):.4g}' for k, v in self.log_dict.items())
        values = f' ({values})' if values else ''
        logger = get_root_logger()
        if self.bad_steps >= self.max_bad_steps:
            message = (f'non-finite loss at iteration {current_iter} in {skipped}{values}: '
                       f'{self.bad_steps} consecutive bad steps (train.max_bad_steps = {self.max_bad_steps}); '
                       'training stopped, the last saved checkpoint is intact')
            logger.error(message)
            raise FloatingPointError(message)
        logger.warning(f'non-finite loss at iteration {current_iter} in {skipped}{values}: step skipped, weights '
                       f'unchanged ({self.bad_steps} consecutive, stop at {self.max_bad_steps})')

    def extra_training_state(self) -> Dict[str, Any]:
        return {**super().extra_training_state(),
                'steps': {'bad_steps': self.bad_steps, 'precision': self.precision.state_dict()}}

    def load_extra_training_state(self, state: Dict[str, Any]) -> None:
        super().load_extra_training_state(state)
        steps = state.get('steps') or {}
        self.bad_steps = int(steps.get('bad_steps', 0))
        self.precision.load_state_dict(steps.get('precision') or {})
