"""Training: the shared loop and the tasks that plug into it.

loop        Trainer: the mesh, shardings and jitted steps; the loop (the step, then its hooks: log, evaluation,
            checkpoint, each at its own cadence)
seeds       one seed or several trained at once (a leading seed axis): what differs between the two
checkpoint  orbax checkpoints with the data position and the model config; the policy on what does not restore
optim       AdamW / LAMB / Adam, the schedule, weight decay by role
state       the training state; metrics: TensorBoard and the console; prefetch: batches made ahead
interrupt   SIGTERM / SIGINT: checkpoint and stop; flops: model FLOPs and MFU
mlm, finetune, translation  the tasks
"""
