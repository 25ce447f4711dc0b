"""Speed benchmarks: each prints its figures beside a baseline measured in the same run.

Run them as modules from the checkout's root (``python -m bench.vs_trl``), so that the
project's packages import as installed and no file here can shadow a package.
"""
