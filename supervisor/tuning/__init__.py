"""Tuning the draft length: the acceptance window, drift detection, the speedup model,
the decisions and their store, and the per-target tuner that ties them together."""
