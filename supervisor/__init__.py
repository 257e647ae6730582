"""specfleet: a supervisor daemon for local LLM servers that use speculative decoding."""

__version__ = "0.1.0"
