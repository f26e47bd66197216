"""Where every composer weight lives in a Hugging Face checkpoint: tensor names and layouts, both directions.

A composer leaf (see composer/params.py) is a stack over `lead` leading axes ([L] layers, or [L, e] layers and
experts) of one HF tensor each. An HF tensor is stored in torch's Linear layout [out, in]; composer keeps
[in, out] with the head axes split out. The map between one stored tensor and one composer slice is

    composer_slice = stored.reshape(view).transpose(perm)

where `view` splits each stored dimension into one or more dimensions (e.g. q_proj [n*h, d] -> [n, h, d]) and
`perm` orders them as composer does (-> wq [d, n, h]). Reading a shard needs only the rows and columns of the
stored tensor that the shard covers (`read_part`), so a device reads its own part of the checkpoint.

Names (transformers' on-disk names, which vLLM and SGLang read too):

    model.embed_tokens.weight [v, d] -> embed [v, d]          lm_head.weight [v, d] -> unembed [d, v]
    model.norm.weight -> final_norm                          model.layers.{i}.input_layernorm -> attn_norm
    model.layers.{i}.post_attention_layernorm -> mlp_norm
    self_attn.{q,k,v}_proj [n*h | g*h, d] -> wq [d, n, h], wk / wv [d, g, h];  o_proj [d, n*h] -> wo [n, h, d]
    self_attn.{q,k}_norm: [h] -> [h] (qk_norm 'head'),  [n*h] / [g*h] -> [n, h] / [g, h] ('proj')
    dense layer: mlp.{gate,up}_proj [f, d] -> w_gate / w_up [d, f];  mlp.down_proj [d, f] -> w_down [f, d]
    MoE layer (qwen3_moe, olmoe): mlp.gate [e, d] -> router [d, e];  mlp.experts.{j}.{gate,up,down}_proj
    MoE layer (mixtral): block_sparse_moe.gate;  block_sparse_moe.experts.{j}.w1 (gate), w3 (up), w2 (down)
"""

import dataclasses
import itertools
import math
from collections.abc import Callable

import numpy as np

from composer.model_config import ModelConfig

# (router/experts module, gate, up, down) of the MoE layer per model_type.
_MOE_NAMES = {
    "qwen3_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "olmoe": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "mixtral": ("block_sparse_moe", "w1", "w3", "w2"),
}
# Tensors a checkpoint may hold that carry no weights of the model (precomputed RoPE frequencies).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclasses.dataclass(frozen=True)
class TensorMap:
    """One composer leaf and the HF tensors it is stacked from.

    path: the leaf's keys in the params tree.  name: the HF tensor name, formatted with `layer` (HF index)
    and `expert`.  lead: number of stacked axes (0, 1 = layers, 2 = layers and experts).  layer_offset: the
    HF index of the stack's first layer.  view, perm: composer_slice = stored.reshape(view).transpose(perm),
    where view holds the sizes each stored dimension splits into.
    """

    path: tuple[str, ...]
    name: str
    shape: tuple[int, ...]  # the whole composer leaf
    lead: int
    view: tuple[tuple[int, ...], ...]
    perm: tuple[int, ...]
    layer_offset: int = 0

    @property
    def stored_shape(self) -> tuple[int, ...]:
        return tuple(math.prod(group) for group in self.view)

    def hf_name(self, index: tuple[int, ...]) -> str:
        """The HF name of the slice at `index` of the lead axes."""
        fields = {}
        if self.lead >= 1:
            fields["layer"] = index[0] + self.layer_offset
        if self.lead >= 2:
            fields["expert"] = index[1]
        return self.name.format(**fields)

    def hf_names(self) -> list[tuple[tuple[int, ...], str]]:
        """(lead index, HF name) of every slice, in order."""
        ranges = [range(n) for n in self.shape[: self.lead]]
        return [(idx, self.hf_name(idx)) for idx in itertools.product(*ranges)]

    def to_hf(self, inner: np.ndarray) -> np.ndarray:
        """One composer slice (the axes after `lead`) in the HF stored layout."""
        return np.transpose(inner, np.argsort(self.perm)).reshape(self.stored_shape)

    def read_part(self, get: Callable, inner: tuple[slice, ...]) -> np.ndarray:
        """The part `inner` (unit-step slices of the composer axes after `lead`) of one stored tensor.

        get(stored_slices) returns those slices of the stored tensor (e.g. safetensors' get_slice). A stored
        dimension that splits into several is read as one contiguous range when only its first split is cut,
        which is how the rules shard heads (the head_dim split is never sharded); otherwise it is read whole
        and cut after the reshape.
        """
        view_idx: list[slice] = [slice(0)] * len(self.perm)
        for i, p in enumerate(self.perm):
            view_idx[p] = inner[i]
        stored, shape, after = [], [], []
        k = 0
        for group in self.view:
            idx = view_idx[k : k + len(group)]
            k += len(group)
            rest = math.prod(group[1:])
            if all(s.start == 0 and s.stop == n for s, n in zip(idx[1:], group[1:])):
                stored.append(slice(idx[0].start * rest, idx[0].stop * rest))
                shape += [idx[0].stop - idx[0].start, *group[1:]]
                after += [slice(None)] * len(group)
            else:
                stored.append(slice(None))
                shape += list(group)
                after += idx
        part = np.asarray(get(tuple(stored))).reshape(shape)[tuple(after)]
        return np.transpose(part, self.perm)


def _attention(cfg: ModelConfig, key: str, n_layers: int, offset: int) -> list[TensorMap]:
    d, n, g, h = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    pre = "model.layers.{layer}.self_attn."

    def m(leaf, name, shape, view, perm):
        return TensorMap((key, "attn", leaf), pre + name, (n_layers, *shape), 1, view, perm, offset)

    maps = [
        m("wq", "q_proj.weight", (d, n, h), ((n, h), (d,)), (2, 0, 1)),
        m("wk", "k_proj.weight", (d, g, h), ((g, h), (d,)), (2, 0, 1)),
        m("wv", "v_proj.weight", (d, g, h), ((g, h), (d,)), (2, 0, 1)),
        m("wo", "o_proj.weight", (n, h, d), ((d,), (n, h)), (1, 2, 0)),
    ]
    if cfg.qk_norm == "head":
        maps += [
            m("q_norm", "q_norm.weight", (h,), ((h,),), (0,)),
            m("k_norm", "k_norm.weight", (h,), ((h,),), (0,)),
        ]
    elif cfg.qk_norm == "proj":
        maps += [
            m("q_norm", "q_norm.weight", (n, h), ((n, h),), (0, 1)),
            m("k_norm", "k_norm.weight", (g, h), ((g, h),), (0, 1)),
        ]
    return maps


def _linear(path: tuple, name: str, d_in: int, d_out: int, lead: tuple[int, ...], offset: int) -> TensorMap:
    """A torch Linear weight [out, in] as composer's [*lead, in, out]."""
    shape = (*lead, d_in, d_out)
    return TensorMap(path, name, shape, len(lead), ((d_out,), (d_in,)), (1, 0), offset)


def _stack(cfg: ModelConfig, model_type: str, moe: bool) -> list[TensorMap]:
    key = "moe_layers" if moe else "dense_layers"
    n_layers = cfg.n_moe_layers if moe else cfg.n_dense_layers
    offset = cfg.n_dense_layers if moe else 0
    d = cfg.d_model
    pre = "model.layers.{layer}."
    maps = [
        TensorMap(
            (key, "attn_norm"), pre + "input_layernorm.weight", (n_layers, d), 1, ((d,),), (0,), offset
        ),
        TensorMap(
            (key, "mlp_norm"),
            pre + "post_attention_layernorm.weight",
            (n_layers, d),
            1,
            ((d,),),
            (0,),
            offset,
        ),
        *_attention(cfg, key, n_layers, offset),
    ]
    if not moe:
        f, lead = cfg.d_ff_dense, (n_layers,)
        return maps + [
            _linear((key, "mlp", "w_gate"), pre + "mlp.gate_proj.weight", d, f, lead, offset),
            _linear((key, "mlp", "w_up"), pre + "mlp.up_proj.weight", d, f, lead, offset),
            _linear((key, "mlp", "w_down"), pre + "mlp.down_proj.weight", f, d, lead, offset),
        ]
    module, gate, up, down = _MOE_NAMES[model_type]
    e, f = cfg.n_experts, cfg.d_ff
    expert = pre + module + ".experts.{expert}."
    return maps + [
        _linear((key, "moe", "router"), pre + module + ".gate.weight", d, e, (n_layers,), offset),
        _linear((key, "moe", "w_gate"), expert + gate + ".weight", d, f, (n_layers, e), offset),
        _linear((key, "moe", "w_up"), expert + up + ".weight", d, f, (n_layers, e), offset),
        _linear((key, "moe", "w_down"), expert + down + ".weight", f, d, (n_layers, e), offset),
    ]


def tensor_maps(cfg: ModelConfig, model_type: str) -> list[TensorMap]:
    """Every leaf of composer's params for `cfg`, as a `model_type` checkpoint lays it out."""
    if cfg.shared_expert_d_ff:
        raise ValueError(f"{model_type} checkpoints have no shared expert (shared_expert_d_ff > 0)")
    if cfg.n_moe_layers and model_type not in _MOE_NAMES:
        raise ValueError(f"{model_type} checkpoints have no MoE layers (the model has {cfg.n_moe_layers})")
    v, d = cfg.vocab_size, cfg.d_model
    maps = [
        TensorMap(("embed",), "model.embed_tokens.weight", (v, d), 0, ((v,), (d,)), (0, 1)),
        TensorMap(("final_norm",), "model.norm.weight", (d,), 0, ((d,),), (0,)),
    ]
    if not cfg.tie_embeddings:
        maps.append(_linear(("unembed",), "lm_head.weight", d, v, (), 0))
    if cfg.n_dense_layers:
        maps += _stack(cfg, model_type, moe=False)
    if cfg.n_moe_layers:
        maps += _stack(cfg, model_type, moe=True)
    return maps


def get_leaf(tree: dict, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree


def set_leaf(tree: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value
