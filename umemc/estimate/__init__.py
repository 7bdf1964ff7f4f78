"""The estimate stage: per-model memory figures (see estimator.estimate_stack)."""
