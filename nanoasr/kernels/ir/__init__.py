"""The LLVM IR the CPU kernels are written in: vector helpers (vector.py), one block decoder per storage type
(blocks.py, quant_blocks.py) and the stored-weight products' inner loop over a task of weight rows
(rows_dot.py)."""
