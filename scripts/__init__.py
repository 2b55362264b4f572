"""The project's measuring and training tools, installed with it: benchmarks (bench/), training (train/), the
latency and load reports, and their shared helpers (report_lib/). Run one as a module from the checkout
(`python -m scripts.bench.bench_lm --help`) or by its path; either way it imports the project's packages as installed.
"""
