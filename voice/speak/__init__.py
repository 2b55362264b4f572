"""Speak: drafts in, committed audio out (phrase speculator, text normalisation, Piper, playback ledger)."""
