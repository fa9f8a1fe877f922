"""jaxpos: pretraining and dissecting Transformers with modern positional encodings, in JAX/Flax."""

__version__ = "0.1.0"
