"""Ways to run a session without the browser, for the `voice-assistant` command (web/cli.py): `local`, this machine's
microphone and speaker; `files`, WAV files as user turns. They sit above the session they drive: no stage imports
them."""
