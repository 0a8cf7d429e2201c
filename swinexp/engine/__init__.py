"""The training engine: the loop, the jitted step, evaluation, checkpoints and resumption."""
