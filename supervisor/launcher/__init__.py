"""How a target's process runs: the built-in launchers, each registered through the
`specfleet.launchers` entry points like a third party's (the contract is
supervisor/plugin/launching.py), and what they share: the running-process record, the
output log and the book of children for the orphan sweep."""
