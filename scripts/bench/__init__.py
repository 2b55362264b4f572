"""Benchmarks: each prints its table and writes its JSON; the README's figures name the command that made them."""
