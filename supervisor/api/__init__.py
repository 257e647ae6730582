"""The daemon's HTTP side: the API, /metrics, the LiteLLM export and the proxy."""
