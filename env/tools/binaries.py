"""Finding and running the real binaries behind grep (ripgrep's `rg`) and read_lints (`ruff`).

Both come from PyPI wheels (`ripgrep`, `ruff`), which put the binary in the interpreter's scripts directory.
That directory is tried before PATH: a PATH entry may be a shell shim (pyenv's cost ~50 ms a call, against
~1.5 ms for the binary itself).
"""

import functools
import os
import selectors
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import NamedTuple

from env.tools.context import ToolError


@functools.cache
def find_binary(name: str) -> str:
    """The path of executable `name`, or raises ToolError naming the missing package."""
    candidates = [Path(sysconfig.get_path("scripts")) / name, Path(sys.executable).parent / name]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    found = shutil.which(name)
    if found:
        return found
    package = {"rg": "ripgrep"}.get(name, name)
    raise ToolError(f"Error: the `{name}` binary is not installed (pip install {package})")


class Run(NamedTuple):
    """A finished (or stopped) binary: its output, exit code (None when killed), and why it was stopped."""

    stdout: bytes
    stderr: bytes
    returncode: int | None
    truncated: bool  # stdout went past max_bytes; the process was killed
    timed_out: bool


def run_binary(argv: list[str], cwd: str, *, timeout: float, max_bytes: int) -> Run:
    """Runs `argv` in `cwd`, reading stdout as it comes and at most a little past `max_bytes` of it.

    The process is killed when its stdout passes `max_bytes` or after `timeout` seconds. stderr is kept to
    its first 64 KiB. Nothing is buffered without bound. An argument holding a NUL byte (which no process
    can receive) is a ToolError; callers check their arguments first to name the one at fault.
    """
    if any("\x00" in a for a in argv):
        raise ToolError("Error: an argument contains a NUL character")
    proc = subprocess.Popen(
        argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0
    )
    deadline = time.monotonic() + timeout
    out, err = bytearray(), bytearray()
    truncated = timed_out = False
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        open_streams = 2
        while open_streams and not (truncated or timed_out):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(remaining):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_streams -= 1
                elif key.data is out:
                    out += chunk
                elif len(err) < 65536:
                    err += chunk
            truncated = len(out) > max_bytes
    if truncated or timed_out:
        proc.kill()
    proc.stdout.close()
    proc.stderr.close()
    try:
        code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:  # closed its output but did not exit
        proc.kill()
        code = proc.wait()
        timed_out = True
    return Run(bytes(out), bytes(err), None if (truncated or timed_out) else code, truncated, timed_out)
