"""XLA flags the project runs with, set in XLA_FLAGS before JAX starts its backend.

XLA reads XLA_FLAGS once, when the first backend starts (the first array or compile, not `import jax`), so
`apply()` must run before that: launch.py and the benchmarks call it first thing. A flag already named in
XLA_FLAGS is left as the user set it.

XLA:CPU hands dots (and some reductions) to the YNNPACK library by default. On the 2-core CPU this project
is tuned on, its own emitters were faster for our shapes (each number the median of several runs, default
flags -> ours): SFT step of the default model (2 x 1792 tokens) 1498-1520 -> 1419-1443 ms; sampler,
multi-turn episodes with prefix reuse 1418-1440 -> 1539-1559 tok/s, every turn prefilled 894-962 ->
980-989; decode of the default model 1574-1611 -> 1623-1641. Compiling a program takes ~10% longer.

With multi_thread_eigen on (the default), XLA:CPU splits each dot over its thread pool; the small dots of
these models (a decode step multiplies 8-16 rows by each weight) pay more to split than they gain, and
with the flag off independent dots (the experts' of one layer) run side by side on the cores instead.
Measured with the flag above set in both: decode at the peer shape of benchmarks/decode.py 991 -> 1150
tokens/s (an expert layer's matmuls at that shape ran as fast on one core as on two with the flag on);
SFT step (2 x 1792 tokens) no change beyond noise (1396 -> 1319 ms in one pair of runs, 1429 -> 1445 in
another); the learner's forward over the same batch 557 -> 554 and 532 -> 526 ms. Both flags are
XLA:CPU's only; GPU and TPU backends ignore them.
"""

import os

CPU_FLAGS = {
    "xla_cpu_experimental_ynn_fusion_type": "",  # "": no op goes to YNNPACK
    "xla_cpu_multi_thread_eigen": "false",  # each dot on one thread (see above)
}


def apply(environ=os.environ) -> str:
    """Adds each of CPU_FLAGS that XLA_FLAGS does not mention to it; returns the new value."""
    flags = environ.get("XLA_FLAGS", "")
    for name, value in CPU_FLAGS.items():
        if f"--{name}" not in flags:
            flags = f"{flags} --{name}={value}".strip()
    environ["XLA_FLAGS"] = flags
    return flags
