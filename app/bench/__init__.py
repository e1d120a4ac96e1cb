"""``lora-gateway bench``: the gateway against vLLM's own server, side by side."""
