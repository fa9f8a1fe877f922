"""The named random streams: one place for the words that keep jaxpos's random draws apart.

A data draw is seeded with [seed, STREAM, ...] (`np.random.default_rng`; masking hashes the same words,
`jaxpos.data.mlm.hash_uniform`). Draws from one seed need different streams, or they repeat each other. The
values are part of every run's data: changing one changes the batches, masks or examples of every run that uses it.
"""

# Masked-LM data, from data.seed (jaxpos/data/pipeline.py; streaming: jaxpos/data/stream.py).
MLM_TRAIN_MASKS = 0  # masks of training rows: (seed, stream, epoch, row, position, draw)
MLM_EVAL_MASKS = 1  # masks of held-out rows: (seed, stream, 0, row, position, draw)
MLM_ROW_ORDER = 2  # the row permutation of each epoch (streaming: of each shuffle window)
MLM_SHARD_ORDER = 3  # streaming: the shard order of each epoch and process
MLM_LENGTH_MASKS = 4  # masks of the held-out stream a length evaluation cuts: (seed, stream, 0, 0, token, draw)

# Translation data, from data.seed (jaxpos/data/translation.py).
TRANSLATION_PACKING = 0  # the order in which pairs are packed into rows
TRANSLATION_ROW_ORDER = 1  # the row permutation of each epoch

# Fine-tuning data, from data.seed (jaxpos/data/classification/, word_order.py, paraphrase.py).
FINETUNE_ROW_ORDER = 3  # the row permutation of each epoch
FINETUNE_SUBSAMPLE = 4  # the data.max_train_examples subset
WORD_ORDER_LOCAL = 1  # a local shuffle of example i: (seed, stream, window, i)
WORD_ORDER_GLOBAL = 2  # a global swap of example i: (seed, stream, 0, i)
# The offline word_order task's sentences, perturbations and order: (seed, stream, split, ...). It shares its
# value with FINETUNE_ROW_ORDER (split 0 and epoch 0 start alike); kept, since another value changes the task.
WORD_ORDER_TASK = 3
BIBLE_PARAPHRASE = 6  # the offline bible_paraphrase task's foils, pairs and order
BIBLE_ORDER = 8  # the offline bible_order task's swaps, pairs and order

# Every task: the sentences a tokenizer trains on (jaxpos/data/tokenizer.py), from data.seed.
TOKENIZER_SAMPLE = 7

# Model randomness, from train.seed: PRNGKey(train.seed) splits into the parameters' initialisation and the
# state's key (jaxpos/training/state.py). DROPOUT is the flax RNG collection of dropout (flax's nn.Dropout draws from it by that
# name) and attention dropout. Its key for step s is fold_in(state.rng, s), and for micro-batch m of an
# accumulated step fold_in of that key and m (jaxpos/training/loop.py).
DROPOUT = "dropout"
# Randomized positions (position.randomized_max_length): the flax RNG collection the stack draws a pass's positions
# from; a training step's key is fold_in of its dropout key and POSITIONS_STREAM (the dropout key itself unchanged).
POSITIONS = "positions"
POSITIONS_STREAM = 1


def step_rngs(rng) -> dict:
    """The flax RNG collections of a training pass from its dropout key: {DROPOUT: rng, POSITIONS: ...}."""
    import jax  # the config layer's other modules need no jax

    return {DROPOUT: rng, POSITIONS: jax.random.fold_in(rng, POSITIONS_STREAM)}
