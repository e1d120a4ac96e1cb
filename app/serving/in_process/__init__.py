"""The ``all`` role's backend: requests run on the vLLM engine in this process, their deltas
counted and shaped into OpenAI answers and chunks here."""
