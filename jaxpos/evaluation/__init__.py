"""Evaluation: GLUE metrics (`metrics`), the word-order probes (`probes`), the papers' seed x learning-rate
protocol (`protocol`), a masked LM's held-out loss at other lengths (`lengths`) and its zero-shot scores of
minimal pairs (`pseudo_likelihood`). Import the submodules directly; this package imports nothing heavy."""
