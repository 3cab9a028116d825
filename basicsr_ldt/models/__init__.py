"""Models of the project; importing this package registers them in BasicSR's MODEL_REGISTRY."""
from basicsr_ldt.models import ft_model, ldt_model  # noqa: F401
