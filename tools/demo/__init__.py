"""Setting up the demo, beside the product: the embedded model (converted from its GGUF),
the demo adapters (trained with PEFT) and the demo tenants' keys (``python -m tools.demo``).

Needs the ``demo`` extra (``peft``, ``gguf``), which a production install leaves out.
"""
