"""Compute kernels. Submodules import numba (cpu) or CuPy on first use only; nothing here imports them."""
