"""One target: its owner task, states, commands, probes, restart policy, status snapshot and run records."""
