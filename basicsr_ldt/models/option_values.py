"""The option values a project model checks as it is built, checked before the run makes anything.

Why: the schema (``basicsr_ldt.common.schema``) knows every key, and the models own their values
(``train.compile``, ``train.cuda_graph``, ``train.amp``, ``train.optim_g.fused``, ``val:``, the
``ldt:`` block, ...). A model is built after the experiment folder, the log and BasicSR's banner, so
a slip there used to print a screen of log lines before its one error. The same functions the
models call run here first, with the device and process layout BasicSR will pick; what depends on
the model (``cuda_graph: true`` for a mode without a recorded step) is still checked when it is built.
"""
from typing import Any, Dict

import torch

from basicsr_ldt.common.schema import PROJECT_MODELS
from basicsr_ldt.models.compiled_blocks import compile_setting, refuse_uncompilable
from basicsr_ldt.models.corgrad_model import corgrad_config_from_options
from basicsr_ldt.models.cuda_graph import graph_mode, refuse_true, unrecordable_run
from basicsr_ldt.models.ema_decay import scaled_ema_decay
from basicsr_ldt.models.guarded_step import max_bad_steps_from_options, precision_from_options
from basicsr_ldt.models.l2_sp import l2_sp_setting
from basicsr_ldt.models.ldt_model import ldt_config_from_options
from basicsr_ldt.models.optimizers import fused_choice
from basicsr_ldt.models.validation import basicsr_device_type, validation_settings


def check_option_values(opt: Dict[str, Any]) -> None:
    """Raise the model's one-line :class:`InputError` for a bad value of a key it reads without a network,
    on the device BasicSR picks from ``num_gpu`` on this machine (``auto``: the GPUs torch sees)."""
    model_type = opt.get('model_type')
    if model_type not in PROJECT_MODELS:   # BasicSR's own models read none of these keys
        return
    train = opt.get('train') or {}
    num_gpu = opt.get('num_gpu', 0)
    num_gpu = torch.cuda.device_count() if num_gpu == 'auto' else num_gpu
    device_type = basicsr_device_type(num_gpu)
    validation_settings({**opt, 'num_gpu': num_gpu})
    refuse_uncompilable(compile_setting(train), (opt.get('network_g') or {}).get('type'))
    fused_choice(train.get('optim_g') or {})
    precision = precision_from_options(train, device_type)
    single_process = not opt.get('dist') and num_gpu <= 1   # BasicSR wraps the network otherwise
    refuse_true(graph_mode(train), unrecordable_run(device_type, precision.dtype, single_process))
    max_bad_steps_from_options(train)
    trained_networks = 1
    if model_type == 'CorGradSRModel' or (opt.get('ldt') or {}).get('method') == 'corgrad':
        corgrad_config_from_options(opt)
        scaled_ema_decay(train)
    elif model_type == 'LDTSRModel':
        trained_networks = 2 if ldt_config_from_options(opt).mode == 'dual' else 1
    else:
        scaled_ema_decay(train)
    l2_sp_setting(opt, trained_networks)
