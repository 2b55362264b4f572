"""Helpers of the scripts: inputs, runners, plots and the Markdown page of the latency and load reports, plus the
real-speech clips and the word error rate of the ASR benchmark.

The report's arithmetic lives in report_math.py and the one percentile of every script in stats.py (no I/O,
unit-tested); runners.py holds the one WebSocket client (`VoiceConnection`), load.py the one RSS sampler, and
tiny_models.py the tiny random checkpoints that the unit tests and `bench_api.py --model tiny` build. The other
modules do the I/O around them. Tests import these modules too: tests/conftest.py puts scripts/ on the import path,
as running a script does.
"""
