"""Toeplitz attention kernels: the public entry `toeplitz_attention` (`api`) and a module per kernel family,
`pallas` (Pallas Triton on GPUs, Pallas Mosaic on TPUs) and `mosaic_gpu` (the Hopper kernels)."""

from jaxpos.attention.kernels.api import toeplitz_attention

__all__ = ["toeplitz_attention"]
