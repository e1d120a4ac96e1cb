"""What runs inside vLLM's own processes (API server, engine core, workers), loaded by vLLM as
our general plugin (:func:`app.inside_vllm.plugin.register`): the tenant-isolating LoRA ops and
the adapter residency recording. It never imports the gateway: vLLM loads it in processes
where none runs."""
