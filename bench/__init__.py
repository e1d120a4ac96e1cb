"""The benchmarks, beside the product: ``python -m bench`` (the gateway against vLLM's own
server, side by side) and ``python -m bench.lora`` (mixed-adapter batches on the CPU engine).

Imports run one way: ``bench`` uses ``app``; nothing in ``app`` imports ``bench``.
"""
