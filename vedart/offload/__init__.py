"""@gpu offload: argument scanning, cost models, NumPy-to-CuPy substitution, results, fallback."""
