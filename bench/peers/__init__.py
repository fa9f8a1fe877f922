"""Peers measured beside jaxpos by bench/train_throughput.py: a plain-JAX BERT and Hugging Face's."""
