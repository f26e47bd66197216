"""Multi-host runs: JAX's multi-controller runtime, state placed on the global mesh, per-process batches.

Every process runs the same program over one global mesh (jax.devices() lists the devices of all
processes). `initialize` connects the processes (coordinator address, number of processes, this process's
id: from arguments, else JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, else the cluster's
own variables, which jax.distributed.initialize detects itself for SLURM, Open MPI and Cloud TPU). Each
process then builds only its share of a batch (`process_rows`) and `global_batch` assembles the global
array without any host holding all of it. Only process 0 logs and writes plots (`is_main_process`).
"""

import os
from collections.abc import Mapping

import jax
import numpy as np
import optax
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from composer import sharding, train

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
# Set by schedulers whose layout jax.distributed.initialize() reads on its own.
_CLUSTER_VARS = ("SLURM_JOB_ID", "OMPI_COMM_WORLD_SIZE", "TPU_WORKER_HOSTNAMES")


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> bool:
    """Connects this process to the others; returns False (and does nothing) for a single-process run.

    Arguments win over environment variables. With none of either but a known cluster scheduler, JAX's
    auto-detection is used. On CPU the cross-process collectives go through gloo (XLA:CPU's default has
    none), so this must run before the first JAX computation.
    """
    env = os.environ if environ is None else environ
    coordinator_address = coordinator_address or env.get(ENV_COORDINATOR) or None
    if num_processes is None and env.get(ENV_NUM_PROCESSES):
        num_processes = int(env[ENV_NUM_PROCESSES])
    if process_id is None and env.get(ENV_PROCESS_ID):
        process_id = int(env[ENV_PROCESS_ID])
    explicit = coordinator_address is not None or num_processes is not None or process_id is not None
    if not explicit and not any(v in env for v in _CLUSTER_VARS):
        return False
    if explicit and (coordinator_address is None or num_processes is None or process_id is None):
        raise ValueError(
            "multi-host needs all of coordinator_address, num_processes and process_id "
            f"(got {coordinator_address!r}, {num_processes!r}, {process_id!r})"
        )
    if num_processes == 1:
        return False
    # CPU-only processes need gloo for collectives across processes; harmless where GPUs do the work.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=coordinator_address, num_processes=num_processes, process_id=process_id
    )
    logging.info(
        "distributed: process %d of %d, %d local / %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.local_device_count(),
        jax.device_count(),
    )
    return True


def is_main_process() -> bool:
    """True on the one process that logs, writes plots and prints (process 0)."""
    return jax.process_index() == 0


def process_rows(n_rows: int) -> slice:
    """The rows of a global batch of `n_rows` that this process builds: an equal, contiguous share.

    The mesh orders devices by process, so process p's devices hold the p-th block of the batch axis.
    """
    n_proc, index = jax.process_count(), jax.process_index()
    if n_rows % n_proc:
        raise ValueError(f"batch of {n_rows} rows does not split over {n_proc} processes")
    share = n_rows // n_proc
    return slice(index * share, (index + 1) * share)


def global_batch(local_batch: Mapping[str, np.ndarray], mesh: Mesh, rules) -> dict[str, jax.Array]:
    """Global [m, b, ...] arrays from each process's [m, b / n_processes, ...] share (process_rows)."""
    n_proc = jax.process_count()
    global_shapes = {k: (v.shape[0], v.shape[1] * n_proc, *v.shape[2:]) for k, v in local_batch.items()}
    shardings = sharding.batch_shardings(
        {k: jax.ShapeDtypeStruct(s, local_batch[k].dtype) for k, s in global_shapes.items()}, mesh, rules
    )
    return {
        k: jax.make_array_from_process_local_data(shardings[k], np.asarray(v), global_shapes[k])
        for k, v in local_batch.items()
    }


def state_shardings(params, optimizer: optax.GradientTransformation, mesh: Mesh) -> train.TrainState:
    """Shardings of the TrainState over `params` (already placed): each optimizer moment (Adam's mu, nu)
    and the f32 master copy (if any) take their parameter's sharding; counters and other scalars are
    replicated."""
    replicated = NamedSharding(mesh, PartitionSpec())
    shapes = jax.eval_shape(lambda p: train.init_state(p, optimizer), params)
    param_sh = jax.tree.map(lambda x: x.sharding, params)
    opt_sh = optax.tree_utils.tree_map_params(
        optimizer,
        lambda _, s: s,
        shapes.opt_state,
        param_sh,
        transform_non_params=lambda _: replicated,
    )
    master_sh = None if shapes.master is None else param_sh
    return train.TrainState(step=replicated, params=param_sh, opt_state=opt_sh, master=master_sh)


def init_state(params, optimizer: optax.GradientTransformation, mesh: Mesh) -> train.TrainState:
    """train.init_state with its output placed by state_shardings (left to itself, jit replicates the
    zero moments, which would put a full copy of the optimizer state on every device)."""
    shardings = state_shardings(params, optimizer, mesh)
    return jax.jit(lambda p: train.init_state(p, optimizer), out_shardings=shardings)(params)
