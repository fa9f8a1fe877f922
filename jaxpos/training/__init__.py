"""Training: the shared loop (sharded jitted steps, checkpoints, metrics) and the tasks that plug into it."""
