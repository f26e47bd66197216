"""Pallas kernels, each with a pure-jnp reference beside it and an ops wrapper."""
