"""The ways in and out of the pipeline: audio conversions and paced streaming, the local microphone, WAV files."""
