"""jaxpos: pretraining and dissecting Transformers with modern positional encodings, in JAX/Flax.

The packages form layers; each imports only from those below it (pyproject.toml's import-linter contract, checked
by `make test`):

    cli            argument parsing and console output, one module per command family
    reproduction   the papers' claims as runs, statistics and a report
    workflows      training, fine-tuning, translation, analysis runs end to end: plain arguments in, results out
    analysis | decoding | evaluation
                   diagnostics and plots; beam search and BLEU; GLUE metrics, the fine-tuning protocol, probes
    checkpoints    Hugging Face import and export of trained runs
    run            a trained run directory (local or a URL): config, task, tokenizer, steps, parameters
    training       the jitted train step, the loop, checkpointing, optimisers, the task's losses
    data | models  siblings that never import each other: corpora, tokenizers, masked-LM packing, translation
                   and classification batches | BERT, the encoder-decoder, the classifier
    positions      the positional mechanisms: parameters -> compact biases (tables, factors)
    attention      attention with positional biases, its implementations and kernels, the path choice (auto)
    sharding | initializers | progress | compilation_cache
    config         the typed configurations and their checks, the registries of mechanisms and of attention
                   implementations
"""

__version__ = "0.1.0"
