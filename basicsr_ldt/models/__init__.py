"""Models of the project; importing this package registers them in BasicSR's MODEL_REGISTRY."""
from basicsr_ldt.models import corgrad_model, ft_model, ldt_model  # noqa: F401
