"""Fidelity against PyTorch: `python -m swinexp.parity [overrides]` trains swinexp and timm's Swin side by side.

Both sides start from swinexp's initial weights and take the same batches; the reference is driven as the
official Swin `main.py` (`reference.py`). Needs the `reference` extra (torch + timm), see the README section
"Checking a run against PyTorch". Importing this package imports neither torch nor timm.
"""
