"""The engine role (``LORA_GATEWAY_ROLE=engine``): vLLM's OpenAI server with our plugin, the
resolver that loads tenants' adapters by global name from the shared store, and only the paths
a front needs. See docs/scale-out.md."""
