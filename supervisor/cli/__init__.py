"""The `specfleet` command line: one module per command."""
