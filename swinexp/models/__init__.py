"""Models: importing this package registers every Swin variant in MODELS."""
from __future__ import annotations

from swinexp.models import swin  # noqa: F401  (registers swin_* in MODELS)
from swinexp.models.factory import create_model
from swinexp.models.pretrained import load_pretrained
from swinexp.models.swin import SWIN_SIZES, SwinTransformer
from swinexp.registry import MODELS

__all__ = ["MODELS", "SWIN_SIZES", "SwinTransformer", "create_model", "load_pretrained"]
