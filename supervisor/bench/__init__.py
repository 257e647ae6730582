"""`specfleet bench`: speculation off against a sweep of draft lengths, per workload class."""
