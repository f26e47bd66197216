"""What every tool returns (`ToolResult`) and the per-episode state the tools share (`ToolContext`)."""

import dataclasses
import os
import threading
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """One tool result as the model sees it: a text block and an error flag; `found_nothing` marks a search
    that matched nothing (grep, codebase_search): not an error, but a call that showed the model nothing."""

    text: str
    is_error: bool = False
    found_nothing: bool = False


class ToolError(Exception):
    """Raised inside a tool; the dispatcher turns it into `ToolResult(str(e), is_error=True)`."""


class ToolContext:
    """The state of one episode's tools.

    `workspace` is the host directory of the episode's repository; the model sees it as `display_root`
    (default `/workspace`, where the sandbox mounts it). `sandbox` runs `run_terminal_cmd` (None: that tool
    answers with an error). `edited_files` holds the workspace-relative paths (symbolic links resolved) that
    write, search_replace and delete_file changed, for grading's shaping terms; `todos` is todo_write's list.

    Tools of one turn run in parallel threads on one context: edits to files are serialised by `edit_lock`
    (each read-modify-write is atomic), terminal commands run concurrently (the sandbox keeps the
    working directory consistent), the codebase-search index is guarded by `search_lock` and the todo
    list by `todo_lock`.
    """

    def __init__(
        self,
        workspace: Path,
        sandbox: Any = None,
        *,
        display_root: str = "/workspace",
        tools: tuple[str, ...] | None = None,
        search_model: str = "",
    ):
        self.workspace = Path(workspace)
        # The tools this episode offers (its system prompt lists them); None: every tool. A call to another
        # one is answered as an unknown tool.
        self.tools = None if tools is None else tuple(tools)
        self.real_workspace = os.path.realpath(self.workspace)
        if not os.path.isdir(self.real_workspace):
            raise NotADirectoryError(f"workspace {workspace} is not a directory")
        self.sandbox = sandbox
        self.display_root = "/" + display_root.strip("/") if display_root.strip("/") else "/"
        self.todos: list[dict] = []
        self.edited_files: set[str] = set()
        # codebase_search's encoder: `encoder` (an `Encoder`) if set, else the trained model in the directory
        # `search_model` ('' for none), else the training-free hashed fallback.
        self.encoder: Any = None
        self.search_model = search_model
        # Passed to sandbox.shell; None lets the sandbox apply its own default.
        self.command_timeout: float | None = None
        self.edit_lock = threading.Lock()
        self.search_lock = threading.Lock()
        self.todo_lock = threading.Lock()
        self.search_index: Any = None  # built by codebase_search on first use
        self._dirty: set[str] = set()  # files edited since the index last looked
        self._record_lock = threading.Lock()

    def record_edit(self, rel: str) -> None:
        """Notes that a tool changed `rel` (workspace-relative): for shaping, and to refresh the index."""
        with self._record_lock:
            self.edited_files.add(rel)
            self._dirty.add(rel)

    def take_dirty(self) -> set[str]:
        """The files edited since the last call."""
        with self._record_lock:
            dirty, self._dirty = self._dirty, set()
        return dirty
