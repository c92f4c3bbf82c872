"""Command-line front end: the only layer that prints, picks exit codes, or catches broadly."""
