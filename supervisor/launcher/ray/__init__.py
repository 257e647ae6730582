"""`launcher: ray`: targets as actors on the nodes of a Ray cluster (docs/ray.md)."""
