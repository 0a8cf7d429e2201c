"""Hydra plugins of swinexp (found by Hydra through the `hydra_plugins` namespace package)."""
