"""Helpers of the scripts: inputs, runners, plots and the Markdown page of the latency and load reports, plus the
real-speech clips and the word error rate of the ASR benchmark.

The report's arithmetic lives in report_math.py (no I/O, unit-tested); the other modules do the I/O around it. Tests
import these modules too: tests/conftest.py puts scripts/ on the import path, as running a script does.
"""
