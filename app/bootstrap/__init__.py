"""One-time set-up: the embedded model and the demo adapters."""
