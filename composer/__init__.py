"""composer: everything that JAX traces (model, sampler, RL maths, train steps, sharding).

Importing the package itself imports no JAX, so that host-side code (env/, the chat format) can use its
plain-Python modules cheaply.
"""
