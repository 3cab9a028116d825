"""Plain fine-tuning (the paper's FT baseline) with this project's safe saving and resuming."""
from basicsr.models.sr_model import SRModel
from basicsr.utils.registry import MODEL_REGISTRY

from basicsr_ldt.models.best import BestCheckpointMixin
from basicsr_ldt.models.resumable import ResumableMixin


@MODEL_REGISTRY.register()
class FTSRModel(BestCheckpointMixin, ResumableMixin, SRModel):
    """BasicSR's ``SRModel``, trained exactly as BasicSR trains it; only checkpoints and training
    states are written atomically and carry RNG state, so ``--auto_resume`` repeats the run, and
    ``val: save_best`` keeps the best-validating weights."""
