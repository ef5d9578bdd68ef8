"""Import stage: source model → Relax module whose runtime values carry source names."""
from .model import ImportedModel, InputSpec

__all__ = ["ImportedModel", "InputSpec"]
