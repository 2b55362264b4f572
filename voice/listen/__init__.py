"""Listen: PCM in; speech start, speech end and transcripts out (VAD, endpointer, streaming Whisper, LocalAgreement)."""
