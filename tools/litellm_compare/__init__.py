"""Our front beside LiteLLM's proxy over the same paced upstream
(``python -m tools.litellm_compare``)."""
