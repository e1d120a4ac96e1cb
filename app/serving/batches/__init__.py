"""OpenAI's Files and Batch APIs (docs/batches.md): tenants' files (:mod:`.files`), the
Batch API's calls (:mod:`.service`), a batch's lines checked and run as the online endpoints'
requests (:mod:`.lines`), and the runner that drives every batch a replica leases
(:mod:`.runner`)."""
