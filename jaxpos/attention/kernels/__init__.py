"""Toeplitz attention kernels: the public entry `toeplitz_attention` (`api`) and a module per kernel family, each
with its code beside it: `pallas` (Pallas Triton on GPUs, Pallas Mosaic on TPUs; `pallas_common`, `pallas_tiles`,
`pallas_forward`, `pallas_backward`) and `mosaic_gpu` (the Hopper kernels; `mosaic_gpu_common`, `mosaic_gpu_tiles`,
`mosaic_gpu_forward`, `mosaic_gpu_backward`)."""

from jaxpos.attention.kernels.api import toeplitz_attention

__all__ = ["toeplitz_attention"]
