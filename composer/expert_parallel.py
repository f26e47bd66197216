"""Expert parallelism: the MoE expert FFN inside jax.shard_map over the 'expert' mesh axis.

The expert weights [e, d, f] are split along e over the 'expert' axis (E_l = e / ep experts per device)
and along f over 'tensor'; tokens are split over every batch-like axis ('data', 'fsdp') and over 'expert'
too, so each device routes its own tokens. One layer then runs:

    ROUTE (outside, replicated router) -> DISPATCH: each device sends every token-slot to the device that
    holds its expert (all-to-all over 'expert') -> EXPERTS: the local experts run on what arrived
    (a psum over 'tensor' finishes the f-split down projection) -> RETURN: the inverse all-to-all ->
    COMBINE: y_i = sum_j w_ij out_ij on the token's own device.

Two exchanges, chosen by cfg.dispatch through composer.moe.DISPATCH_IMPLS:
- 'ep_capacity' (GShard, Lepikhin et al. 2020): each device fills a dense buffer [e, c, d] with
  c = ceil(capacity_factor * m_local * k / e) slots per expert, and one dense `all_to_all` moves the
  [E_l, c, d] block of every destination. Works on every backend, XLA:CPU included; overflow is dropped
  per (source device, expert), so with drops the result differs from the single-device capacity layer.
- 'ep_ragged_dot' (dropless): token-slots sorted by expert travel with `jax.lax.ragged_all_to_all`
  (no padding on the wire), the local experts run as one grouped matmul (`ragged_dot`). XLA:CPU has no
  ragged-all-to-all; `ragged_all_to_all_gathered` computes the same exchange with an all_gather, for
  testing the offsets logic on CPU.

Without a mesh in context (jax.set_mesh) or with an 'expert' axis of size 1, both run the single-device
dispatch they parallelise ('capacity' / 'ragged_dot'): the results are the same, only the placement differs.
"""

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from composer import moe, registry
from composer.model_config import ModelConfig

EXPERT_AXIS = "expert"
TENSOR_AXIS = "tensor"
# Mesh axes the tokens are split over inside the shard_map (those present in the mesh are used).
TOKEN_AXES = ("data", "fsdp", EXPERT_AXIS)
_WEIGHTS = ("w_gate", "w_up", "w_down")


def ragged_all_to_all_gathered(
    operand: jax.Array,
    output: jax.Array,
    input_offsets: jax.Array,
    send_sizes: jax.Array,
    output_offsets: jax.Array,
    recv_sizes: jax.Array,
    *,
    axis_name: str,
) -> jax.Array:
    """jax.lax.ragged_all_to_all's result, computed with all_gather (for backends without the op).

    Device s sends operand[input_offsets[r] : + send_sizes[r]] to device r, where it lands at
    output[output_offsets[r] : + send_sizes[r]] (output_offsets are offsets in the receiver's buffer).
    Rows of `output` that receive nothing keep their value. Memory is ep times the operand: tests only.
    """
    del recv_sizes  # implied by the gathered send sizes
    me = jax.lax.axis_index(axis_name)
    operand_snd = jax.lax.all_gather(operand, axis_name)  # [ep, n_in, d]
    start_s = jax.lax.all_gather(output_offsets, axis_name)[:, me]  # where source s writes in my buffer
    size_s = jax.lax.all_gather(send_sizes, axis_name)[:, me]
    from_s = jax.lax.all_gather(input_offsets, axis_name)[:, me]
    row_n = jnp.arange(output.shape[0])
    hit_sn = (row_n >= start_s[:, None]) & (row_n < (start_s + size_s)[:, None])
    src_row_sn = jnp.clip(from_s[:, None] + row_n - start_s[:, None], 0, operand.shape[0] - 1)
    values_snd = jax.vmap(lambda x_nd, rows_n: x_nd[rows_n])(operand_snd, src_row_sn)
    received_nd = jnp.sum(jnp.where(hit_sn[..., None], values_snd, 0), axis=0)
    return jnp.where(jnp.any(hit_sn, axis=0)[:, None], received_nd, output).astype(output.dtype)


RAGGED_EXCHANGES: dict[str, Callable] = {
    "native": jax.lax.ragged_all_to_all,
    "gathered": ragged_all_to_all_gathered,
}


def _local_swiglu_capacity(x_ecd: jax.Array, p: dict, tensor: str | None) -> jax.Array:
    out = moe.expert_swiglu(x_ecd, p)
    return jax.lax.psum(out, tensor) if tensor else out


def _capacity_shard(x_md, expert_mk, weight_mk, valid_m, p, *, cfg: ModelConfig, ep: int, tensor):
    """Per device: dense GShard dispatch. Returns (y_md float32, [dropped, real] assignment counts)."""
    m, d = x_md.shape
    e_local = cfg.n_experts // ep
    c = moe.capacity(m, cfg)
    x_ecd, plan = moe.capacity_dispatch(x_md, expert_mk, valid_m, cfg.n_experts, c)
    # DISPATCH: block r of the expert axis goes to device r; what arrives is indexed by source device.
    x_secd = jax.lax.all_to_all(x_ecd.reshape(ep, e_local, c, d), EXPERT_AXIS, 0, 0, tiled=False)
    x_local = x_secd.transpose(1, 0, 2, 3).reshape(e_local, ep * c, d)
    out_local = _local_swiglu_capacity(x_local, p, tensor)
    # RETURN: the inverse exchange puts every slot back on its source, in the [e, c] layout it left.
    out_secd = out_local.reshape(e_local, ep, c, d).transpose(1, 0, 2, 3)
    out_ecd = jax.lax.all_to_all(out_secd, EXPERT_AXIS, 0, 0, tiled=False).reshape(cfg.n_experts, c, d)
    y_md = moe.capacity_combine(out_ecd, plan, weight_mk)
    counts = jnp.stack([jnp.sum(plan.real_a & ~plan.kept_a), jnp.sum(plan.real_a)]).astype(jnp.float32)
    return y_md, counts


def _ragged_shard(
    x_md, expert_mk, weight_mk, valid_m, p, *, cfg: ModelConfig, ep: int, tensor, exchange, gmm
):
    """Per device: dropless dispatch with a ragged exchange and a grouped matmul over local experts.

    The receive buffer holds ep * m * k rows, the worst case (every slot of every device routed here), so
    nothing is ever dropped. Returns (y_md float32, [0, real] assignment counts).
    """
    m, k = expert_mk.shape
    d = x_md.shape[-1]
    n_experts, e_local = cfg.n_experts, cfg.n_experts // ep
    n_send, n_recv = m * k, ep * m * k
    me = jax.lax.axis_index(EXPERT_AXIS)

    # Sort this device's assignments a = i * k + j by expert; padding goes last and is never sent.
    expert_a = jnp.where(valid_m[:, None], expert_mk, n_experts).reshape(-1)
    order_a = jnp.argsort(expert_a, stable=True)
    x_ad = x_md[order_a // k]
    count_re = jnp.bincount(expert_a, length=n_experts + 1)[:n_experts].reshape(ep, e_local)

    # Sizes of every (source s, destination r, local expert) block, known to every device.
    count_sre = jax.lax.all_gather(count_re, EXPERT_AXIS).astype(jnp.int32)
    size_sr = jnp.sum(count_sre, axis=-1)
    in_offset_sr = jnp.cumsum(size_sr, axis=1) - size_sr  # where s's block for r starts in s's sorted rows
    out_offset_sr = jnp.cumsum(size_sr, axis=0) - size_sr  # where s's block starts in r's receive buffer

    # DISPATCH
    x_nd = exchange(
        x_ad,
        jnp.zeros((n_recv, d), x_ad.dtype),
        in_offset_sr[me],
        size_sr[me],
        out_offset_sr[me],
        size_sr[:, me],
        axis_name=EXPERT_AXIS,
    )
    # Received rows: source blocks in source order, each sorted by local expert. Label each row with its
    # local expert (e_local for the unused tail), then group rows by expert for the grouped matmul.
    seg_count = count_sre[:, me, :].reshape(-1)  # (s, e) segments, s-major, contiguous in x_nd
    seg_end = jnp.cumsum(seg_count)
    row_n = jnp.arange(n_recv)
    seg_n = jnp.searchsorted(seg_end, row_n, side="right")
    expert_n = jnp.where(seg_n < ep * e_local, seg_n % e_local, e_local)
    order_n = jnp.argsort(expert_n, stable=True)
    group_sizes = jnp.sum(count_sre[:, me, :], axis=0).astype(jnp.int32)
    xs = x_nd[order_n]
    dtype = x_md.dtype
    gate = gmm(xs, p["w_gate"].astype(dtype), group_sizes)
    up = gmm(xs, p["w_up"].astype(dtype), group_sizes)
    out_sorted = gmm((jax.nn.silu(gate) * up).astype(dtype), p["w_down"].astype(dtype), group_sizes)
    if tensor:
        out_sorted = jax.lax.psum(out_sorted, tensor)
    out_nd = jnp.zeros_like(out_sorted).at[order_n].set(out_sorted)

    # RETURN: block s of the receive buffer goes back to s, where it lands where it was sent from.
    out_ad = exchange(
        out_nd,
        jnp.zeros((n_send, d), out_nd.dtype),
        out_offset_sr[:, me],
        size_sr[:, me],
        in_offset_sr[:, me],
        size_sr[me],
        axis_name=EXPERT_AXIS,
    )
    inverse_a = jnp.zeros_like(order_a).at[order_a].set(jnp.arange(n_send, dtype=order_a.dtype))
    out_mkd = out_ad[inverse_a].reshape(m, k, d).astype(jnp.float32)
    y_md = jnp.einsum("mkd,mk->md", out_mkd, jnp.where(valid_m[:, None], weight_mk, 0))
    counts = jnp.stack([jnp.zeros((), jnp.float32), jnp.sum(valid_m).astype(jnp.float32) * k])
    return y_md, counts


def _expert_parallel(
    x_md: jax.Array,
    expert_mk: jax.Array,
    weight_mk: jax.Array,
    valid_m: jax.Array,
    p: dict,
    cfg: ModelConfig,
    *,
    shard_fn: Callable,
    fallback: Callable,
) -> tuple[jax.Array, jax.Array]:
    """Runs `shard_fn` on every device of the context mesh, tokens and experts split as described above.

    Token count m is padded to a multiple of the token shards (padding tokens are invalid: no slot, no
    output). Returns (y_md, dropped_fraction) like every entry of composer.moe.DISPATCH_IMPLS.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.shape.get(EXPERT_AXIS, 1) == 1:
        return fallback(x_md, expert_mk, weight_mk, valid_m, p, cfg)
    ep = mesh.shape[EXPERT_AXIS]
    if cfg.n_experts % ep:
        raise ValueError(f"n_experts {cfg.n_experts} is not a multiple of the expert axis ({ep})")
    token_axes = tuple(a for a in TOKEN_AXES if a in mesh.axis_names)
    n_shards = math.prod(mesh.shape[a] for a in token_axes)
    size_t = mesh.shape.get(TENSOR_AXIS, 1)
    tensor = TENSOR_AXIS if size_t > 1 and cfg.d_ff % size_t == 0 else None

    m = x_md.shape[0]
    pad = -m % n_shards
    if pad:
        x_md, expert_mk, weight_mk = (jnp.pad(a, ((0, pad), (0, 0))) for a in (x_md, expert_mk, weight_mk))
        valid_m = jnp.pad(valid_m, (0, pad))
    weights = {name: p[name] for name in _WEIGHTS}
    tok = P(token_axes)
    w_specs = {"w_gate": P(EXPERT_AXIS, None, tensor), "w_up": P(EXPERT_AXIS, None, tensor)}
    w_specs["w_down"] = P(EXPERT_AXIS, tensor, None)

    def body(x_md, expert_mk, weight_mk, valid_m, weights):
        y_md, counts = shard_fn(x_md, expert_mk, weight_mk, valid_m, weights, ep=ep, tensor=tensor)
        return y_md, jax.lax.psum(counts, token_axes)

    y_md, counts = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(tok, tok, tok, tok, w_specs),
        out_specs=(tok, P()),
    )(x_md, expert_mk, weight_mk, valid_m, weights)
    dropped = counts[0] / jnp.maximum(counts[1], 1)
    return y_md[:m].astype(x_md.dtype), dropped.astype(jnp.float32)


def experts_ep_capacity(x_md, expert_mk, weight_mk, valid_m, p, cfg: ModelConfig):
    """Expert-parallel capacity dispatch (dense all_to_all): the 'ep_capacity' dispatch."""
    shard_fn = functools.partial(_capacity_shard, cfg=cfg)
    return _expert_parallel(
        x_md, expert_mk, weight_mk, valid_m, p, cfg, shard_fn=shard_fn, fallback=moe.experts_capacity
    )


def experts_ep_ragged(
    x_md, expert_mk, weight_mk, valid_m, p, cfg: ModelConfig, *, exchange: str = "native", gmm=None
):
    """Expert-parallel dropless dispatch (ragged all-to-all + grouped matmul): 'ep_ragged_dot'.

    `exchange` names an entry of RAGGED_EXCHANGES; `gmm` is a grouped matmul with ragged_dot semantics
    (default jax.lax.ragged_dot) or an import path.
    """
    gmm = registry.load(gmm or jax.lax.ragged_dot, "the grouped matmul of expert-parallel dispatch")
    shard_fn = functools.partial(
        _ragged_shard, cfg=cfg, exchange=registry.resolve(RAGGED_EXCHANGES, exchange, "exchange"), gmm=gmm
    )
    fallback = functools.partial(moe.experts_dropless, gmm=gmm)
    return _expert_parallel(x_md, expert_mk, weight_mk, valid_m, p, cfg, shard_fn=shard_fn, fallback=fallback)
