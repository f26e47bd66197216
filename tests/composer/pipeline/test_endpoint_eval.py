"""`--mode=eval` against an OpenAI-compatible endpoint: the suite's tasks, the tools in the sandbox and the
grading of the suite EVAL, the model a served one (here an engine replaying turns: one writes the gold
fix, one gives up)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from serving_helpers import Replay, Server, require_bubblewrap

from composer.pipeline import learner as learner_lib
from composer.serving import openai_api
from env import chat
from env.tasks import load_task
from env.tasks.diffs import apply_patch
from experiments import composer as experiment

ROOT = Path(__file__).resolve().parents[3]


def _suite(tmp_path: Path) -> Path:
    suite = tmp_path / "suite"
    subprocess.run(
        [sys.executable, "-m", "env.tasks", "generate", "--out", str(suite), "--count", "1", "--seed", "0"],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    return suite


def _gold_write(task, tmp_path: Path) -> str:
    """A turn that replaces the gold fix's file whole (search_replace, one of the tiny config's tools)."""
    fixed = tmp_path / "fixed"
    shutil.copytree(task.repo, fixed)
    (rel,) = apply_patch(fixed, task.patch)
    old, new = (Path(task.repo) / rel).read_text(), (fixed / rel).read_text()
    call = {"name": "search_replace", "arguments": {"file_path": rel, "old_string": old, "new_string": new}}
    return f"Writing the fix.\n{chat.TOOL_CALL_OPEN}\n{json.dumps(call)}\n{chat.TOOL_CALL_CLOSE}"


@pytest.mark.parametrize("solves", [True, False])
def test_a_served_model_is_evaluated_and_graded_on_a_suite(tmp_path, solves):
    require_bubblewrap("each episode")
    suite = _suite(tmp_path)
    (task_dir,) = [p.parent for p in suite.glob("*/task.json")]
    task = load_task(task_dir)
    turns = [_gold_write(task, tmp_path), "Done."] if solves else ["I could not find the bug."]
    config = experiment.get_config("tiny")
    tokenizer = learner_lib.fit_tokenizer(config, turns * 10)
    server = Server(openai_api.make_app(Replay(tokenizer, config, turns), "replay"))
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    try:
        out = subprocess.run(
            [sys.executable, "launch.py", "--config=experiments/composer.py:tiny", "--mode=eval",
             f"--config.eval.tasks={suite}", f"--config.eval.endpoint={server.url}",
             "--config.eval.model=replay", f"--workdir={tmp_path / 'run'}"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
    finally:
        server.close()
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["tasks"] == 1 and summary["solved"] == (1 if solves else 0)
    results = tmp_path / "run" / "eval_suites" / "suite-endpoint-replay"
    (line,) = (results / "tasks.jsonl").read_text().splitlines()
    (episode,) = json.loads(line)["episodes"]
    assert episode["reward"] == (1.0 if solves else 0.0) and episode["stop"] == "answer", episode
    assert episode["tool_errors"] == 0
    assert episode["turns"] == (2 if solves else 1)


def test_an_endpoint_needs_a_model_name_and_a_suite(tmp_path):
    from composer.pipeline import endpoint_eval

    config = experiment.get_config("tiny")
    config.eval.update(endpoint="http://127.0.0.1:9/v1", tasks=str(tmp_path))
    with pytest.raises(ValueError, match="eval.model"):
        endpoint_eval.run(config, tmp_path)
