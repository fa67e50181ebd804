"""Pure policy math: no I/O, time and randomness are arguments."""
