"""Built-in backend plugins, one module per runtime, loaded through entry points."""
