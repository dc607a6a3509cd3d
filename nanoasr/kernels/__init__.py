"""Compute kernels, importing nothing of nanoasr but nanoasr.storage and themselves.

CPU (numba, LLVM): target.py (the CPU features they may use); jit.py (numba's njit, its disk cache keyed on
every kernel source); ir/ (vector IR helpers, block decoders, the products' inner loop); stored/ (products
and widening over weights in their stored type, with the checked entry points); int8/ (rows quantized to
int8); bf16/ (rows rounded to bf16); elementwise.py, softmax.py, attention.py, decode_layer.py (a decode
step's layer as one call); blas_split.py (batched BLAS products on numba's threads). GPU (numba.cuda): cuda/.
Importing this package imports neither numba nor CuPy; each module imports them itself.
"""
