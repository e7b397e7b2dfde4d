"""Experiments and gating: the sweep, its hypotheses, the pytest-benchmark plugin, the merge gate."""
