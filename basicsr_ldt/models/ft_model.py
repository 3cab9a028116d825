"""Plain fine-tuning (the paper's FT baseline) with this project's safe saving and resuming."""
from basicsr.models.sr_model import SRModel
from basicsr.utils.registry import MODEL_REGISTRY

from basicsr_ldt.models.guarded_step import GuardedStepMixin
from basicsr_ldt.models.resumable import ResumableMixin


@MODEL_REGISTRY.register()
class FTSRModel(GuardedStepMixin, ResumableMixin, SRModel):
    """BasicSR's ``SRModel``, trained as BasicSR trains it, plus ``train: amp`` and skipping of
    non-finite losses; checkpoints and training states are written atomically and carry RNG
    state, so ``--auto_resume`` repeats the run."""
