"""What the reproduction's profile files (configs/reproduce/*.py, each `get_config()` -> the fields of a
`matrix.Profile`) share: the analysis sizes of the tiny model, the unoptimised compile flags of small profiles, and
the name of the matrix of every registered mechanism."""

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
TINY_ANALYSIS = dict(num_probe_words=16, probe_length=128, lengths=(16, 32, 64, 128), windows=2, probe_epochs=10,
                     probe_patience=3, probe_learning_rate=3e-3, decomposition_sentences=8)
EVERY_MECHANISM = "every"  # `mechanisms` of a profile that runs every registered mechanism and its variants
