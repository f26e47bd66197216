"""Sandboxes for model-written commands: one per episode, over a private copy of the task repository.

    ws = make_workspace(task_dir / "repo")            # private, size-capped copy (host path)
    with Sandbox(ws, limits=Limits(timeout_s=60), python_env=venv) as sb:  # None: our own Python
        sb.shell("cd pkg")                            # run_terminal_cmd: the directory persists
        result = sb.shell("python -m pytest -q")      # CommandResult(exit_code, output, timed_out, ...)
        sid, pid, log = sb.start_background("python -m http.server")
    remove_workspace(ws)

Host-side tools read and write the workspace directly through its host path (`sb.workspace`); commands
see it at `sb.root` (SANDBOX_ROOT under bwrap and unshare, the host path under 'none'). Files the host
writes with open()/Path.write_text stay writable inside; a file created with a narrower mode (e.g.
tempfile.mkstemp's 0600) needs `sb.adopt(path)` first. `sb.host_path(inside)` maps a path seen inside (in
the workspace or /tmp, e.g. a background log) to the host.

`resolve_isolation(requested)` says at start-up which level sandboxes will run at, or raises
IsolationUnavailable ('auto' needs bubblewrap; weaker levels only when forced).

Modules: isolation.py (levels, bwrap and unshare command lines, probing), pythons.py (the Python
installations commands see), spawner.py (starts each command inside the slot's limits), process.py
(deadline and capped output), limits.py (rlimits, cgroups), slots.py (per-slot uid and state),
workspace.py (copies, size caps, ownership), sandbox.py (the Sandbox), __main__.py (CLI).
"""

from env.sandbox.isolation import SANDBOX_ROOT, IsolationUnavailable, detect_isolation, resolve_isolation
from env.sandbox.limits import Limits
from env.sandbox.sandbox import CommandResult, Sandbox
from env.sandbox.workspace import make_workspace, remove_workspace

__all__ = [
    "SANDBOX_ROOT",
    "CommandResult",
    "IsolationUnavailable",
    "Limits",
    "Sandbox",
    "detect_isolation",
    "make_workspace",
    "resolve_isolation",
    "remove_workspace",
]
