"""The ``front`` role's backend: requests prepared and settled here, run on an upstream
OpenAI server (vLLM's, or the Inference Extension's gateway in front of the engine pods)."""
