"""The gateway's engine client: the interface the serving layer runs requests on, and its
implementation on vLLM's in-process engine."""
