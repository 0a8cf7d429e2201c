"""Mixed precision: the named policies (`conf/amp/`), the backend's overflow check, and what a policy does to a net.

`policies` registers o0 ... o3 in AMP_POLICIES; `overflow` decides how the train step sees an fp16 overflow on each
backend; `precision` resolves a policy on a chip (what the card is asked to do, what the policy computes there);
`report` prints per-cell dtypes and the drift against fp32 (imported where used: it needs the model).
"""
from swinexp.amp.policies import ASCEND_PRECISION_MODES, AUTO, KEEP_ORIGIN, AmpPolicy

__all__ = ["ASCEND_PRECISION_MODES", "AUTO", "KEEP_ORIGIN", "AmpPolicy"]
