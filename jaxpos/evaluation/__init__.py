"""Evaluation of fine-tuned models: GLUE metrics (`metrics`), the word-order probes (`probes`) and the papers'
seed x learning-rate protocol (`protocol`). Import the submodules directly; this package imports nothing heavy."""
