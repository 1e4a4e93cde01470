"""The work of examples/multi_gpu.py's gpu_map, in a module its worker processes can import."""

import vedart as veda


@veda.gpu
def column_sums_of_gram(matrix):
    return (matrix @ matrix.T).sum(axis=0)
