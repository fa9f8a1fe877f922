"""What each `jaxpos` command does, as functions of configs, paths and numbers: they write the run's files where
the command always has, report progress through jaxpos.progress, and return their results (dicts and dataclasses)
for jaxpos.cli to print. Above analysis, evaluation, checkpoints and decoding; below reproduction and the command
line."""
