"""composer: a small MoE coding agent trained with SFT then GRPO on generated Python repair tasks.

Command (the embedded default, the CPU run of the main job):

    python launch.py --config=experiments/composer.py

Hardware: a 2-core CPU, no accelerator, no downloads. Run time: 29.6-31.2 minutes measured alone with an
empty compilation cache (DATA 6-7, SFT 8, EVAL 6-8, RL 4, EVAL 4). Expected result: the SFT model solves
about 120-150 of the 200 held-out tasks and RL's 4 steps move that by a few tasks either way (runs: SFT
123 -> RL 133, 147 -> 147, 147 -> 146, 147 -> 144). The model: 3.9 M parameters in total, 1.5 M active
per token (``--mode=info`` prints them).

Variants, chosen by the argument after the colon:

- ``:tiny``: 0.25 M parameters and a handful of tasks; the whole pipeline runs in a few minutes on any
  CPU and solves nothing. Used by the tests.
- ``:gpu``: one H200-class GPU, 4.9 B parameters in total (0.9 B active per token), bf16 compute.

Any suite of task directories (SWE-bench-style task.json + repo/) instead of generated tasks:

    python launch.py --config=experiments/composer.py --config.env.tasks=DIR [--config.eval.tasks=HELDOUT]
    python launch.py --config=experiments/composer.py --mode=eval --config.eval.tasks=DIR --workdir=RUN
                     [--config.eval.samples_per_task=8 --config.eval.temperature=0.6]

The first trains on DIR (composer/pipeline/suites.py says how held-out tasks are split off without
eval.tasks); the second evaluates RUN's latest checkpoint on DIR and prints a JSON line with pass@k last
(composer/pipeline/eval_suite.py).

Any value can be overridden, e.g. ``--config.rl.learning_rate=3e-6``; the dict is locked, so a misspelt
key fails at start-up with its name. The measurements behind the values are in docs/experiments.md.
"""

import ml_collections

ConfigDict = ml_collections.ConfigDict

# Logical axis -> mesh axes: how every weight and activation is sharded (missing or None: replicated).
DEFAULT_RULES = (
    ("batch", ("data", "fsdp")),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("exp", "expert"),
    ("layers", None),
    ("seq", None),
)


def get_config(arg: str | None = None) -> ConfigDict:
    """Returns the config for variant `arg` (None: the embedded default; 'tiny'; 'gpu')."""
    variant = arg or "default"
    if variant not in ("default", *_OVERRIDES):
        raise ValueError(f"unknown variant {variant!r} of experiments/composer.py: use tiny, gpu or none")
    c = ConfigDict()
    c.experiment = "composer" if variant == "default" else f"composer-{variant}"
    c.seed = 0
    c.compilation_cache_dir = "~/.cache/composer/jax"  # '' turns it off; JAX_COMPILATION_CACHE_DIR wins
    c.compilation_cache_max_gib = 8.0  # least recently used programs out first beyond this
    c.model = _model()
    c.moe = _values(
        n_experts=8,
        top_k=2,
        d_ff=256,
        norm_topk_prob=True,
        shared_expert_d_ff=0,
        dispatch="capacity",  # composer/moe.py registry: 'capacity' (fast on CPU) | 'ragged_dot'
        capacity_factor=2.0,
        aux_loss_coef=1e-2,
        z_loss_coef=1e-3,
    )
    # Device mesh over ('data', 'fsdp', 'expert', 'tensor'); -1 takes the remaining devices.
    c.mesh = _values(data=-1, fsdp=1, expert=1, tensor=1, rules=DEFAULT_RULES)
    c.optim = _values(
        b1=0.9,
        b2=0.95,
        eps=1e-8,
        weight_decay=0.01,
        grad_clip=1.0,
        warmup_steps=5,
        micro_batches=4,
        micro_batch_rows=8,  # micro-batches of at most this many sequences each (0: no bound)
        micro_batch_tokens=0,  # and of at most this many padded tokens each, rows x length (0: no bound)
    )
    c.sft = _values(
        learning_rate=3e-3,
        steps=300,
        batch_size=2,
        n_trajectories=600,
        edit_weight=1.0,  # loss weight of the expert's edit turn's tokens
        change_weight=1.0,  # and of the tokens of new_string that write the change
    )
    c.rl = _rl()
    c.sampling = _values(
        temperature=0.6,  # RL rollouts' (the learner scores the same tempered policy)
        top_p=1.0,
        decode_slots=16,
        steps_per_call=8,
        max_prefill_rows=4,  # rows of one prefill / extend call at most (0: decode_slots)
        max_turn_tokens=192,  # the expert's longest turn at difficulty 1 is 166 tokens
        max_active=0,  # episodes alive at once (0: decode_slots)
        kv_cache_gib=0.0,  # the decode slots' cache at most this big: fewer slots, turns wait (0: no bound)
    )
    c.env = _env()
    c.eval = _values(
        n_tasks=200,
        tasks="",  # a suite directory: held-out tasks when training, the suite of --mode=eval ('': none)
        endpoint="",  # --mode=eval: an OpenAI-compatible endpoint's base URL (instead of a checkpoint)
        model="",  # and the endpoint's model name
        samples_per_task=1,  # --mode=eval on eval.tasks: episodes a task for pass@k (> 1: temperature > 0)
        temperature=0.0,  # 0: greedy
        episode_timeout_s=900.0,  # a safety cap: EVAL grades, nothing waits on an episode
        every_steps=20,  # RL steps between points of the held-out curve (0: none but its two ends)
        curve_tasks=24,  # the curve's fixed subset: the first this many held-out tasks (0: no curve)
        pass_k_tasks=0,  # held-out tasks for the SFT model's pass@k, k = rl.group_size (0: off)
        next_call_tasks=12,  # held-out expert trajectories scored by turn (0: off)
    )
    c.plan = _values(device="h200")  # --mode=plan: the device kind to plan for (composer/memory_plan.py)
    c.checkpoint = _values(
        every_steps=20,
        rl_every_steps=1,
        max_to_keep=2,
    )
    if variant in _OVERRIDES:
        _OVERRIDES[variant](c)
    return c


def _values(**values) -> ConfigDict:
    return ConfigDict(values)


def _model() -> ConfigDict:
    """A decoder-only MoE transformer (composer/model.py) with a copy head (composer/copy_head.py)."""
    return _values(
        vocab_size=2048,
        split_closing_quotes=True,  # a closing double quote is a token of its own
        d_model=128,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        head_dim=32,
        qk_norm="none",  # 'none' | 'head' (Qwen3) | 'proj' (OLMoE): too flat for 32-wide heads
        rope_theta=10_000.0,
        rms_eps=1e-6,
        tie_embeddings=False,
        copy_head_dim=64,  # a pointer over the context mixed into the next-token distribution
        copy_head_ngram=3,  # exact-match bonus over the last 1..3 tokens: a copy, once started, continues
        copy_head_recency=True,
        copy_head_lines=True,
        copy_loss_coef=0.2,  # weight of a loss on the pointer alone during SFT (0: none)
        n_dense_layers=0,  # the first n layers use a dense SwiGLU MLP instead of experts
        d_ff_dense=512,
        max_seq_len=2048,
        param_dtype="float32",
        compute_dtype="float32",
        attention_impl="cpu",  # composer/attention.py: 'cpu' (tuned for XLA:CPU) | 'reference' | 'pallas'
        remat="none",  # the learner's layers in the backward pass: 'none' | 'full' | 'save_dots'
        logits_chunk=0,  # learner log-probs this many positions at a time (0: all; no copy head only)
        init_from="",  # a local Hugging Face checkpoint directory to start from ('' = random init)
        # init_from's conversations: 'checkpoint' (its own chat template, when it has one) | 'native'
        chat_template="checkpoint",
    )


def _rl() -> ConfigDict:
    """GRPO-family updates on groups of rollouts (composer/pipeline/rl.py), or PPO ('gae')."""
    return _values(
        algorithm="grpo",  # advantage estimator: 'grpo' | 'drgrpo' | 'rloo' | 'gae' (PPO)
        learning_rate=1e-4,
        steps=4,
        tasks_per_step=4,
        group_size=4,
        clip_low=0.2,
        clip_high=0.28,
        kl_coef=0.0,
        tis_cap=2.0,  # truncated importance sampling between sampler and learner log-probs
        mask_truncated=True,  # truncated episodes out of the loss
        max_staleness=1,
        epochs=1,  # passes over each rollout batch (PPO's ratio and clip act from the second update on)
        minibatches=1,  # optimizer steps per pass: the batch's episodes split this many ways
        overlap_update=False,  # one batch's update beside the next batch's rollouts (composer/pipeline/rl.py)
        expert_start_share=0.5,  # tasks whose episodes continue the expert's conversation before its edit
        expert_guidance=True,  # each group takes the expert's continuation as one more member
        dynamic_sampling=True,  # drop (and replace) groups whose rewards are all equal
        dynamic_sampling_budget=1,  # per step, drop at most this many x tasks_per_step such groups
        skip_no_signal_updates=True,  # a batch whose advantages are all zero is not trained on
        gamma=1.0,
        gae_lambda=0.95,
        value_coef=0.5,  # PPO ('gae'): weight of the value loss
        value_clip=0.0,  # PPO: clip values around the old ones by this much (0: no clipping)
    )


def _env() -> ConfigDict:
    """Tasks, sandboxes and the rollout pool (env/)."""
    return _values(
        tasks="",  # a suite directory to train on instead of generated tasks (composer/pipeline/suites.py)
        n_train_tasks=600,  # generated tasks; a suite directory is used whole
        n_heldout_tasks=200,  # generated; or at most this many split off env.tasks when eval.tasks is ''
        difficulty=1,
        families="missing_return,early_return",  # comma-separated bug families ('': all eight)
        n_workers=2,
        rollout_backend="local",  # 'local' (worker processes here) | 'ray' (workers across a cluster)
        ray_address="",  # for 'ray': '' = RAY_ADDRESS if set, else a local cluster; or 'host:port'
        isolation="auto",  # 'auto': bwrap, else a start-up error; 'unshare' | 'none' force weaker (warned)
        max_turns=8,
        max_episode_tokens=2048,
        episode_timeout_s=120.0,
        command_timeout_s=30.0,
        tool_schemas="compact",  # 'full' (with descriptions) | 'compact' (names and argument types)
        tools="run_terminal_cmd,grep,search_replace",  # offered tools ('': all eleven)
        search_model="",  # codebase_search's trained encoder (python -m composer.search_model); '': hashed
    )


def _tiny(c: ConfigDict) -> None:
    c.model.update(vocab_size=1024, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16)
    c.model.update(d_ff_dense=128, max_seq_len=2048, copy_head_dim=16)
    c.moe.update(n_experts=4, top_k=2, d_ff=64)
    c.sft.update(steps=10, batch_size=4, n_trajectories=8)
    # The tiny model solves nothing: keep its all-zero groups and train on them, to exercise the update.
    c.rl.update(steps=2, tasks_per_step=2, group_size=2, dynamic_sampling=False, skip_no_signal_updates=False)
    c.sampling.update(decode_slots=4, max_turn_tokens=64)
    c.env.update(n_train_tasks=8, n_heldout_tasks=4, max_turns=4, max_episode_tokens=2048)
    c.eval.update(n_tasks=4, next_call_tasks=2, every_steps=2, curve_tasks=2)
    c.checkpoint.update(every_steps=1, rl_every_steps=1)
    c.optim.warmup_steps = 2


def _gpu(c: ConfigDict) -> None:
    c.model.update(vocab_size=32_768, d_model=2048, n_layers=16, n_heads=16, n_kv_heads=4, head_dim=128)
    c.model.update(n_dense_layers=1, d_ff_dense=6144, max_seq_len=16_384, rope_theta=1_000_000.0)
    c.model.update(param_dtype="bfloat16", compute_dtype="bfloat16", qk_norm="head")
    # A Qwen3-MoE checkpoint has no copy head (export and init_from stay exact).
    c.model.update(
        copy_head_dim=0, copy_head_ngram=0, copy_head_recency=False, copy_head_lines=False, copy_loss_coef=0.0
    )
    # 32 experts: RL with f32 master weights and AdamW fits one H200 with room to spare (--mode=plan).
    c.moe.update(n_experts=32, top_k=8, d_ff=768, dispatch="auto")  # Pallas gmm on a GPU, else ragged_dot
    c.model.attention_impl = "auto"  # the Pallas flash kernels on a GPU, else the XLA forms
    # A micro-batch's activations bounded by its tokens: one 16K-token episode, or eight of 2K.
    c.optim.update(micro_batch_rows=0, micro_batch_tokens=16_384)
    # The learner's memory (docs/scaling.md): layers rematerialised, log-probs over the vocabulary in chunks.
    c.model.update(remat="full", logits_chunk=1024)
    c.sft.update(batch_size=64, steps=2000)
    c.rl.update(steps=1000, tasks_per_step=32, group_size=16, learning_rate=1e-6)
    # max_prefill_rows 0: one call for every waiting request of a width (batching pays here).
    c.sampling.update(decode_slots=256, steps_per_call=32, max_prefill_rows=0, max_turn_tokens=2048)
    c.sampling.kv_cache_gib = 16.0  # 28 slots of 18K tokens; the held-out curve's sampler takes as much
    c.env.update(n_workers=16, tool_schemas="full", tools="", families="")  # all tools, all eight families
    c.env.update(
        n_train_tasks=5000, n_heldout_tasks=200, difficulty=2, max_turns=40, max_episode_tokens=16_384
    )
    c.eval.n_tasks = 200
    c.checkpoint.update(every_steps=50, rl_every_steps=10)


_OVERRIDES = {"tiny": _tiny, "gpu": _gpu}
