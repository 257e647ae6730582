"""What specfleet knows about model files: headers (GGUF, Hugging Face), file identity and the pairing guard."""
