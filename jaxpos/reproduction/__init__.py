"""`jaxpos reproduce`: a small-scale reproduction of the five papers' central claims, with seeds and verdicts.

matrix     the fixed recipes (profiles), the run matrix (mechanism x seed, each with the stages its claims need),
           the configs of a run, the plan
pool       the process pool that executes runs (one per core, or several per GPU); host: the machine's facts
pipeline   one run: pretrain, the learning curve, fine-tune on the paraphrase and word-order tasks, probes, analyses
stats      paired tests over seeds, Holm's correction, the verdict rule
readings   what a claim reads: accessors of the runs' numbers
judging    how a claim is judged: comparisons and bounds, and how its parts combine
judges     one judge a claim
claims     what each claim says, the paper's figure, the runs it reads and its judge
verdicts   the claims' verdicts over a table of runs
report     REPRODUCTION.md, its figures and numbers.json
reproduce  the command from plan to report; a SLURM array task's single run
"""
