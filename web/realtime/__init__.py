"""The OpenAI Realtime API on /v1/realtime: a thin translation over the same voice session that /ws speaks.

`audio` converts the API's audio formats to and from the session's PCM16, `client_events` parses and validates what a
client sends, `translator` is the protocol core (client events -> session calls, session events -> server events;
its state in `translator_state`, its steps by family of events in `input_audio_buffer`, `conversation_items`,
`responses` and `response_output`) and `actions` what it asks of its shell, all without I/O; `shell` runs one
connection. REALTIME.md lists every event and what this server does with it.
"""
