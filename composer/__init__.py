"""composer: the model side. The traced code (model, MoE, attention, sampler, RL maths, train steps,
sharding) and the host-side pipeline that drives it (composer/pipeline). It imports env/, never the reverse.
"""
