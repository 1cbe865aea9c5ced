"""The demo: run the whole system end to end against the sandbox and report what happened."""
