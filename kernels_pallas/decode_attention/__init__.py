"""Decode attention (one query per row against the KV cache, split along the cache): kernel and reference."""
