"""Serving a model: the engine that steps the sampler for concurrent requests, and the OpenAI-compatible API
over it (`python -m composer.serve`)."""
