"""Plain fine-tuning (the paper's FT baseline) with this project's safe saving and resuming."""
from basicsr.models.sr_model import SRModel
from basicsr.utils.registry import MODEL_REGISTRY

from basicsr_ldt.models.best import BestCheckpointMixin
from basicsr_ldt.models.ema_decay import rescale_ema_decay, scaled_ema_decay
from basicsr_ldt.models.guarded_step import GuardedStepMixin
from basicsr_ldt.models.optimizers import AdamBuilderMixin
from basicsr_ldt.models.resumable import ResumableMixin
from basicsr_ldt.models.validation import ValidationMixin


@MODEL_REGISTRY.register()
class FTSRModel(ValidationMixin, BestCheckpointMixin, GuardedStepMixin, ResumableMixin, AdamBuilderMixin, SRModel):
    """BasicSR's ``SRModel``, trained as BasicSR trains it, plus ``train: amp`` and skipping of
    non-finite losses; checkpoints and training states are written atomically and carry RNG
    state, so ``--auto_resume`` repeats the run, and ``val: save_best`` keeps the best-validating
    weights. ``train.ema_reference_iters`` rescales ``ema_decay`` to the run's length; Adam is fused on
    CUDA unless ``train.optim_g.fused`` says otherwise (``optimizers``); ``train.cuda_graph`` replays
    the step's forward, loss and backward as one CUDA graph (``cuda_graph``)."""

    def init_training_settings(self) -> None:
        scaled = scaled_ema_decay(self.opt['train'])   # refused before anything is built
        super().init_training_settings()
        rescale_ema_decay(self, scaled)
        self.setup_step_graph()
        # BasicSR starts net_g_ema from the file's 'params_ema' whatever path.param_key_g names; a fresh
        # run starts both copies from the weights the user chose (a resumed one keeps its EMA copy).
        path = self.opt['path']
        if self.ema_decay > 0 and path.get('pretrain_network_g') and not path.get('resume_state') \
                and path.get('param_key_g', 'params') != 'params_ema':
            self.net_g_ema.load_state_dict(self.get_bare_model(self.net_g).state_dict())
