"""Models: importing this package registers every Swin variant in MODELS."""
from __future__ import annotations

from swinexp.models import swin  # noqa: F401  (registers swin_* in MODELS)
from swinexp.models.swin import SWIN_VARIANTS, SwinTransformer
from swinexp.registry import MODELS

__all__ = ["MODELS", "SWIN_VARIANTS", "SwinTransformer"]
