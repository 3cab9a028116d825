"""Best-checkpoint selection (``val: save_best``) for every model type of this project.

The official LDT script validates every 500 steps and keeps the weights only when PSNR improves;
BasicSR keeps fixed-iteration checkpoints and just logs the best value. Here the selecting
validation set is named in the YAML, the selected weights go to ``models/net_g_best.pth`` (written
atomically, so a kill never leaves a torn file), and the best value so far travels in the training
state, so a resumed run keeps comparing against it instead of starting over.
"""
from typing import Any, Dict, List, Optional, Tuple

from basicsr.utils import get_root_logger

from basicsr_ldt.common.errors import InputError

BEST_LABEL = 'best'


def validated_network(opt: Dict, networks: Tuple[str, ...]) -> Optional[str]:
    """The network validation measures: ``val.best_network``, else the model type's first choice.

    The one place that default lives, so that what validation measures, what selects
    ``net_g_best.pth`` and what the log names cannot drift apart (``None``: one network only).
    """
    return (opt.get('val') or {}).get('best_network', networks[0] if networks else None)


def refuse_missing_branch(opt: Dict, mode: str) -> None:
    """``val.best_network`` names a branch that only LDT's dual mode has: with one network (FT, LP-FT,
    LDT-S) validation measures that network while the log said the branch was validated."""
    which = (opt.get('val') or {}).get('best_network')
    if mode != 'dual' and which in ('primary', 'auxiliary'):
        raise InputError(f"val.best_network: {which!r} is a branch of LDT's two networks (ldt mode 'dual'), and ldt "
                         f"mode '{mode}' trains one network; expected composite (or leave best_network out)")


def best_selection(opt: Dict, networks: Tuple[str, ...] = ()) -> Optional[Dict[str, Any]]:
    """The validated ``val`` selection options, or ``None`` when ``save_best`` is off.

    ``networks`` are the values ``val.best_network`` may take for this model type (empty: the key
    is not accepted). With several validation sets the selecting one must be named
    (``best_dataset``): picking one silently could select on target-camera test images.
    """
    val = opt.get('val') or {}
    network = validated_network(opt, networks)
    if 'best_network' in val and network not in networks:
        allowed = f"one of {', '.join(map(repr, networks))}" if networks else f"no value ({opt.get('model_type')} " \
            'has one network)'
        raise InputError(f'val.best_network: expected {allowed}, got {network!r}')
    save = val.get('save_best', False)
    if not isinstance(save, bool):
        raise InputError(f'val.save_best: expected true or false, got {save!r}')
    if not save:
        given = [k for k in ('best_metric', 'best_dataset') if k in val]
        if given:
            raise InputError(f"val.{given[0]}: expected only with 'val: save_best: true' (it has no effect without)")
        return None
    metrics = val.get('metrics') or {}
    metric = val.get('best_metric', 'psnr')
    if metric not in metrics:
        raise InputError(f"val.best_metric: expected one of val.metrics ({', '.join(metrics) or 'none'}), got {metric!r}")
    names = [d.get('name', phase) for phase, d in (opt.get('datasets') or {}).items() if phase.split('_')[0] == 'val']
    if not names:
        raise InputError("val.save_best needs a validation set: add a 'datasets: val_*' section (held-out "
                         'source-camera images; selecting on target-camera test images is not a fair protocol)')
    dataset = val.get('best_dataset')
    if dataset is None and len(names) > 1:
        raise InputError(f'val.save_best with {len(names)} validation sets: name the one that selects with '
                         f"val.best_dataset (one of {', '.join(names)})")
    if dataset is not None and dataset not in names:
        raise InputError(f"val.best_dataset: expected the name of a validation set ({', '.join(names)}), "
                         f'got {dataset!r}')
    return {'metric': metric, 'dataset': dataset or names[0], 'network': network,
            'higher': metrics[metric].get('better', 'higher') == 'higher'}


class BestCheckpointMixin:
    """Keeps ``net_g_best.pth``; needs ``ResumableMixin`` after it (atomic ``save_network``,
    ``extra_training_state``). ``validated_networks`` lists the ``val.best_network`` choices."""

    validated_networks: Tuple[str, ...] = ()

    def __init__(self, opt: Dict) -> None:
        self.best_options = best_selection(opt, self.validated_networks) if opt.get('is_train') else None
        self.best_record: Optional[Dict[str, Any]] = None
        super().__init__(opt)

    def best_weights(self) -> Tuple[List, List[str]]:
        """What ``net_g_best.pth`` holds: what ``save`` writes as ``net_g`` (with its EMA copy if any)."""
        if getattr(self, 'ema_decay', 0) > 0 and hasattr(self, 'net_g_ema'):
            return [self.net_g, self.net_g_ema], ['params', 'params_ema']
        return [self.net_g], ['params']

    def validation(self, dataloader, current_iter, tb_logger, save_img=False):
        super().validation(dataloader, current_iter, tb_logger, save_img)
        selection = self.best_options
        if selection is None or dataloader.dataset.opt.get('name') != selection['dataset']:
            return
        if self.opt['rank'] != 0:  # BasicSR computes metrics on rank 0 only; it alone saves
            return
        value = float(self.metric_results[selection['metric']])
        best = self.best_record
        improved = best is None or (value > best['value'] if selection['higher'] else value < best['value'])
        logger = get_root_logger()
        if not improved:
            logger.info(f"Best {selection['metric']} on {selection['dataset']} stays {best['value']:.4f} "
                        f"(iteration {best['iter']}); now {value:.4f}")
            return
        nets, keys = self.best_weights()
        self.save_network(nets, 'net_g', BEST_LABEL, param_key=keys)
        self.best_record = {'metric': selection['metric'], 'dataset': selection['dataset'], 'value': value,
                            'iter': int(current_iter)}
        validated = f" ({selection['network']} network validated)" if selection['network'] else ''
        logger.info(f"New best {selection['metric']} on {selection['dataset']}: {value:.4f} at iteration "
                    f'{current_iter}{validated}; saved models/net_g_{BEST_LABEL}.pth')

    def extra_training_state(self) -> Dict[str, Any]:
        state = super().extra_training_state()
        if self.best_record is not None:
            state['best'] = dict(self.best_record)
        return state

    def load_extra_training_state(self, state: Dict[str, Any]) -> None:
        super().load_extra_training_state(state)
        record, selection = state.get('best'), self.best_options
        if record is None or selection is None:
            return
        if (record['metric'], record['dataset']) != (selection['metric'], selection['dataset']):
            get_root_logger().warning(f"the saved best ({record['metric']} on {record['dataset']}) was selected "
                                      'otherwise than now: selection starts afresh')
            return
        self.best_record = dict(record)
        get_root_logger().info(f"Resumed best {record['metric']} on {record['dataset']}: {record['value']:.4f} "
                               f"at iteration {record['iter']}")
