"""The shared call helpers: a public op's config resolution and the launch arguments its kernels get."""

import jax

from kernels_pallas.decode_attention.ops import DecodeConfig
from kernels_pallas.gmm.ops import GmmConfig
from kernels_pallas.pallas_call import launch_args, op_config


def test_op_config_defaults_and_resolves_interpret():
    on_cpu = jax.default_backend() == "cpu"
    assert op_config(None, GmmConfig, None) == GmmConfig(interpret=on_cpu)
    mine = DecodeConfig(split=64, num_warps=2)
    assert op_config(mine, DecodeConfig, False) == DecodeConfig(split=64, num_warps=2, interpret=False)
    assert op_config(mine, DecodeConfig, True).interpret is True


def test_launch_args_are_the_configs_launch_fields():
    config = GmmConfig(num_warps=4, num_stages=None, interpret=True)
    assert launch_args(config) == dict(num_warps=4, num_stages=None, interpret=True)
