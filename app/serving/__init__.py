"""Serving logic between the routes and the engine: prompts, sampling, responses."""
