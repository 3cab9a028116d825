"""Datasets of the project; importing this package registers them in BasicSR's DATASET_REGISTRY."""
from basicsr_ldt.data import drealsr_dataset  # noqa: F401
from basicsr_ldt.data.cameras import DREALSR_CAMERAS, CameraRule  # noqa: F401
