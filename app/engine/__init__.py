"""The inference engine behind a narrow interface, and our vLLM plugin."""
