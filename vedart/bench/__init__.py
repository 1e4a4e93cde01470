"""Benchmarks behind ``python -m vedart bench SUITE``: medians after warm-up, device synchronised,
ratios taken within one run."""
