"""nvmflab's exit statuses, one meaning each (docs/CONTRACTS.md, "Exit statuses")."""

OK = 0
FAILED = 1  # measured a failure (a point failed, a soak lost data) or a regression (compare's gate)
BAD_INPUT = 2  # bad input, or data that cannot be read or written; nothing was judged
INCONCLUSIVE = 3  # compare's gate: the runs neither show a regression nor rule it out
INTERNAL = 70  # a bug in nvmflab (EX_SOFTWARE), never bad input
INTERRUPTED = 130  # Ctrl-C / SIGINT
PIPE_CLOSED = 141  # the reader of stdout went away (`| head`): 128 + SIGPIPE, as a shell tool killed by it
