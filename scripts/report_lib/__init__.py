"""Helpers of scripts/latency_report.py and scripts/load_test.py: inputs, runners, plots and the Markdown page.

The arithmetic lives in voice/report_math.py (no I/O, unit-tested); these modules do the I/O around it.
"""
