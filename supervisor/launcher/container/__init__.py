"""launcher: container: runtimes that live in images (docs/containers.md)."""
