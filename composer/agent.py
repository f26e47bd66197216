"""Run the agent on your own repository: the model calls the Cursor tools in a sandbox on a copy of it.

    python -m composer.agent --repo PATH "the task" --base-url http://127.0.0.1:8000/v1 [--model composer]
    python -m composer.agent --repo PATH "the task" --config=experiments/composer.py --workdir=RUN
    ... --apply                                       # write the agent's changes back to PATH

The model is any OpenAI-compatible endpoint (`python -m composer.serve`, vLLM, a hosted API), or a run's
model served in this process (--config / --workdir, loaded as composer.serve loads it). Each turn's text,
calls and the first lines of their results stream to the terminal; the run ends with the unified diff of the
copy against the repository. Nothing is written to the repository without --apply. Terminal commands run in
the sandbox (env.sandbox: bubblewrap), never on the host.
"""

import shutil
import sys
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

from composer import xla_flags
from composer.agent_loop import apply_changes, changed_files, run_agent, unified_diff

_CONFIG = config_flags.DEFINE_config_file("config", None, "A run's config (a model served in-process).")
_WORKDIR = flags.DEFINE_string("workdir", None, "That run's directory: its latest checkpoint and tokenizer.")
_REPO = flags.DEFINE_string("repo", None, "The repository to work on (copied; untouched without --apply).")
_BASE_URL = flags.DEFINE_string("base_url", None, "An OpenAI-compatible endpoint, e.g. http://host:8000/v1.")
_MODEL = flags.DEFINE_string("model", "composer", "The endpoint's model name.")
_API_KEY = flags.DEFINE_string("api_key", "none", "The endpoint's API key.")
_MAX_TURNS = flags.DEFINE_integer("max_turns", 20, "Model turns at most.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 1024, "Tokens a turn at most.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature (0: greedy).")
_TOOLS = flags.DEFINE_string("tools", "", "Comma-separated tools to offer ('': all).")
_APPLY = flags.DEFINE_bool("apply", False, "Write the agent's changes back to --repo.")


def _local_endpoint(config, workdir: str | None):
    """A run's model served in this process on a free port: (base_url, stop)."""
    from composer.serving import load

    api, engine = load.build(config, workdir, "composer")
    server = load.LocalServer(api)

    def stop() -> None:
        server.close()
        engine.close()

    return server.url, stop


def main(argv: list[str]) -> None:
    import openai

    from env.sandbox import Sandbox
    from env.sandbox.workspace import make_workspace
    from env.tools import ToolContext, offered_tools

    if len(argv) != 2:
        raise app.UsageError('give the task as one argument: python -m composer.agent --repo PATH "task"')
    if not _REPO.value or not Path(_REPO.value).is_dir():
        sys.exit(f"FATAL: --repo {_REPO.value!r} is not a directory")
    repo = Path(_REPO.value).resolve()
    stop = None
    base_url = _BASE_URL.value
    if base_url is None:
        if _CONFIG.value is None:
            sys.exit("FATAL: give --base-url URL (an OpenAI-compatible endpoint) or --config (and --workdir)")
        try:
            base_url, stop = _local_endpoint(_CONFIG.value, _WORKDIR.value)
        except ValueError as e:
            sys.exit(f"FATAL: {e}")
    workspace = make_workspace(repo)
    try:
        client = openai.OpenAI(base_url=base_url, api_key=_API_KEY.value, max_retries=0, timeout=600)
        tools = offered_tools(_TOOLS.value)
        sandbox = Sandbox(workspace)
        try:
            ctx = ToolContext(workspace, sandbox, tools=tools)
            run_agent(
                client, _MODEL.value, argv[1], ctx, tools=tools, max_turns=_MAX_TURNS.value,
                max_tokens=_MAX_TOKENS.value, temperature=_TEMPERATURE.value,
            )  # fmt: skip
        finally:
            sandbox.close()
        changes = changed_files(repo, workspace)
        print("\n" + (unified_diff(changes) or "(no changes)"))
        if _APPLY.value and changes:
            apply_changes(repo, changes)
            print(f"applied {len(changes)} file(s) to {repo}")
        elif changes:
            print(f"(not applied: rerun with --apply to write {len(changes)} file(s) to {repo})")
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
        if stop is not None:
            stop()


if __name__ == "__main__":
    xla_flags.apply()
    app.run(main)
