"""LoRA Gateway: a multi-tenant, OpenAI-compatible gateway over one vLLM engine."""

__version__ = "0.1.0"
