"""`jaxpos reproduce`: a small-scale reproduction of the five papers' central claims, with seeds and verdicts.

runs       the fixed recipes (profiles), the run matrix (mechanism x seed, each with the stages its claims need),
           the configs of a run, and the process pool that executes runs (one per core, or several per GPU)
pipeline   one run: pretrain, the learning curve, fine-tune on the paraphrase task, Chen et al.'s probe, analyses
stats      paired tests over seeds, Holm's correction, the verdict rule
claims     the claims (what each needs, the paper's figure, a judge per claim) and their verdicts
report     REPRODUCTION.md, its figures and numbers.json
reproduce  the command from plan to report; a SLURM array task's single run
"""
