"""OpenAI's Files and Batch APIs (docs/batches.md): tenants' files (:mod:`.files`)."""
