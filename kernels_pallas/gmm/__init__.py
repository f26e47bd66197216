"""Grouped matmul (ragged_dot semantics) for the MoE experts: kernel, custom_vjp wrapper, reference."""
