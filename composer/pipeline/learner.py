"""The learner's pieces shared by SFT and RL: model config, the copy head's line tokens, mesh, sharded
train state, jitted steps."""

import dataclasses
from collections.abc import Callable

import jax
import ml_collections
import numpy as np
from absl import logging

from composer import batching, copy_head, distributed, model, sharding, train
from env.tokenizer import Tokenizer, train_tokenizer


@dataclasses.dataclass
class Learner:
    """Everything one training phase needs; `state` changes, the rest is fixed for the phase."""

    cfg: model.ModelConfig
    mesh: jax.sharding.Mesh
    rules: tuple
    optimizer: object
    state: train.TrainState
    step_fn: Callable
    static: dict
    _compiled: dict = dataclasses.field(default_factory=dict)

    def step(self, batch: dict[str, np.ndarray], key: jax.Array) -> dict:
        """One update; compiles once per batch shape (batches are bucketed, so a handful of shapes)."""
        shape = tuple(sorted((k, v.shape) for k, v in batch.items()))
        # The mesh in context lets expert-parallel dispatch (moe.dispatch='ep_*') find the 'expert' axis.
        with jax.set_mesh(self.mesh):
            if shape not in self._compiled:
                self._compiled[shape] = train.jit_step(
                    self.step_fn, self.state, batch, self.mesh, self.rules, **self.static
                )
            self.state, metrics = self._compiled[shape](self.state, batch, key)
        return metrics

    @property
    def params(self):
        return self.state.params


def model_config(config: ml_collections.ConfigDict, tokenizer: Tokenizer) -> model.ModelConfig:
    """The model config for `tokenizer`: its vocabulary must fit."""
    cfg = model.ModelConfig.from_config(config)
    vocab_size = tokenizer.vocab_size
    if vocab_size > cfg.vocab_size:
        raise ValueError(f"the tokenizer has {vocab_size} tokens but model.vocab_size is {cfg.vocab_size}")
    return cfg


_ASSISTANT = "assistant"  # the role's name in the chat template (env/chat.py)


def line_tokens(cfg: model.ModelConfig, tokenizer: Tokenizer) -> copy_head.LineTokens | None:
    """The chat tokens that the copy head's line keys need, from `tokenizer`: what every call of a model
    of `cfg` takes beside it (learner steps, reference log-probs, the sampler). None where cfg has no line
    keys (config.model.copy_head_lines off, or no copy head)."""
    if not copy_head.uses_line_keys(cfg):
        return None
    role = tokenizer.encode(_ASSISTANT)
    if len(role) != 1:
        raise ValueError(f"line keys need the role {_ASSISTANT!r} to be one token, got {role}")
    vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
    newlines = sorted(i for i in vocab.values() if "\n" in tokenizer.decode([i]))
    return copy_head.LineTokens(tokenizer.im_start_id, tokenizer.im_end_id, role[0], tuple(newlines))


def fit_tokenizer(config: ml_collections.ConfigDict, texts: list[str]) -> Tokenizer:
    """A tokenizer of config.model.vocab_size trained on `texts`. Where the copy head's line keys need the
    assistant role as one token and the corpus did not merge it into one (a corpus of real code spends a
    small vocabulary's merges elsewhere), it is trained again with the role as a whole-word token."""
    model_config = config.model
    tokenizer = train_tokenizer(texts, model_config.vocab_size, model_config.split_closing_quotes)
    if len(tokenizer.encode(_ASSISTANT)) != 1:
        tokenizer = train_tokenizer(
            texts, model_config.vocab_size, model_config.split_closing_quotes, whole_words=(_ASSISTANT,)
        )
    return tokenizer


def build(
    config: ml_collections.ConfigDict,
    cfg: model.ModelConfig,
    *,
    learning_rate: float,
    total_steps: int,
    step_fn: Callable,
    line_tokens: copy_head.LineTokens | None,
    init_params=None,
    **static,
) -> Learner:
    """A learner with params born sharded on the config's mesh (or `init_params` placed there). Its steps
    call `step_fn` with the keywords cfg, line_tokens (`line_tokens`'s), optimizer and those of `static`."""
    mesh = sharding.make_mesh(config.mesh)
    rules = tuple(config.mesh.rules)
    optimizer = train.make_optimizer(config.optim, learning_rate, total_steps)
    if init_params is None:
        params = sharding.init_sharded(jax.random.key(config.seed), cfg, mesh, rules)
    else:
        params = jax.device_put(init_params, sharding.param_shardings(cfg, mesh, rules))
    # Optimizer moments take their parameter's sharding (a plain jit would replicate them on every device).
    state = distributed.init_state(params, optimizer, mesh)
    total, active = model.param_counts(cfg)
    logging.info("learner: %s parameters (%s active per token) on mesh %s", f"{total:,}", f"{active:,}", mesh)
    static = dict(static, cfg=cfg, line_tokens=line_tokens, optimizer=optimizer)
    return Learner(cfg, mesh, rules, optimizer, state, step_fn, static)


def pack(sequences: list[dict], config: ml_collections.ConfigDict, batch_size: int) -> dict:
    """Sequences -> [m, b, t] arrays: `optim.micro_batches` micro-batches, or more where that would put more
    than `optim.micro_batch_rows` sequences or `optim.micro_batch_tokens` padded tokens (b x t) in one
    (0: no bound; a micro-batch holds at least one row). An update's peak memory is one micro-batch's
    activations, so a larger batch (more RL tasks per step, longer episodes) takes more micro-batches
    instead of more memory."""
    optim, max_len = config.optim, config.model.max_seq_len
    micro = max(batch_size // optim.micro_batches, 1)
    if optim.micro_batch_rows > 0:
        micro = min(micro, optim.micro_batch_rows)
    if optim.micro_batch_tokens > 0:
        longest = max((len(s["tokens"]) for s in sequences), default=1)
        micro = min(
            micro, max(optim.micro_batch_tokens // batching.bucket_length(longest, max_len=max_len), 1)
        )
    return batching.pack_sequences(sequences, micro_batch=micro, max_len=max_len)
