"""launcher: container (issue 18): runtimes that live in images; groundwork only."""
