"""Fleet file loading: line-aware YAML, schema, cross-checks."""
