"""Test-wide setup: 8 fake CPU devices for the sharding tests (must be set before JAX is imported)."""

import os
import sys
from pathlib import Path

# Fewer XLA optimisation passes: the tests' programs are small, and compiling dominates their time.
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
    " --xla_llvm_disable_expensive_passes=true",
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
