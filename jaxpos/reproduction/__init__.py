"""`jaxpos reproduce`: a small-scale reproduction of the five papers' central claims, with seeds and verdicts.

runs      the run matrix (mechanisms x seeds), profiles, the budget split (steps per run from a quick timing) and
          the scheduler (one process per run, spread over the host's cores or GPUs)
pipeline  one run: pretrain, fine-tune on the offline word-order task, word-order probe, analyses over training
claims    one function per claim: measured numbers -> a verdict (holds / contradicted / inconclusive)
report    REPRODUCTION.md, its figures and numbers.json
cli       the `jaxpos reproduce` command
"""
