"""Serving a completion request, in the order it happens (docs/architecture.md):

- :mod:`app.serving.lifecycle`: one owner for each request's lifecycle (resolve, limit,
  prepare, reserve, admit, run, settle), whatever runs it;
- :mod:`app.serving.preparation`: a request checked and tokenised the same way wherever it
  runs (templates, tools, output constraints, the worst case to reserve);
- :mod:`app.serving.backend`: the seam, where a request runs, with its two sides,
  :mod:`app.serving.in_process` (the engine in this process) and :mod:`app.serving.front`
  (an upstream OpenAI server).
"""
