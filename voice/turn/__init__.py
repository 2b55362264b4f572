"""One turn of a conversation: the turn-taking machine and the session core around it (no I/O), the session shell
that executes their actions, the answer being spoken, the turn detector's schedule and its runs, each open turn's
record, and the clock the machine hears."""
