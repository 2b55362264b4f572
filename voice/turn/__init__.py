"""One turn of a conversation: the turn-taking machine (no I/O), the session shell that executes its actions, the
answer being spoken, each open turn's record, and the clock the machine hears."""
