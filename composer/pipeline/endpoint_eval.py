"""EVAL of any served model on a suite.

    python launch.py --config=experiments/composer.py --mode=eval --config.eval.tasks=DIR \
        --config.eval.endpoint=URL --config.eval.model=NAME

The same tasks, tools, sandboxes and grading as the suite EVAL (composer/pipeline/eval_suite.py), with the
model behind an OpenAI-compatible endpoint (`python -m composer.serve`, a vLLM server, a hosted API; the key
from OPENAI_API_KEY, else none): each episode is the agent's loop (composer/agent_loop.py, the tools' JSON
schemas passed as `tools`, calls returned as `tool_calls`) on a copy of the task's repository, at most
env.max_turns turns, then graded. env.n_workers episodes run at once. Outputs in
workdir/eval_suites/<suite>-endpoint-<model>/ (results.json, tasks.jsonl); the last line printed is the
summary, as the suite EVAL's: {"tasks", "solved", "solve_rate", "pass_at_k"}.
"""

import collections
import concurrent.futures
import io
import json
import os
import time
from pathlib import Path

import ml_collections
from absl import logging

from composer import agent_loop
from composer.pipeline import eval_suite, isolation, suites
from env import reward, sandbox, tools
from env.tasks import environments


def episode(client, config: ml_collections.ConfigDict, task) -> dict:
    """One graded episode of the endpoint's model on `task`: {'reward', 'turns', 'stop', 'tool_errors'}
    (reward None: the episode could not be run, with 'error')."""
    workspace = sandbox.make_workspace(task.repo)
    box = None
    try:
        box = sandbox.Sandbox(
            workspace, isolation=config.env.isolation, python_env=environments.python_env(task)
        )
        offered = tools.offered_tools(config.env.tools)
        ctx = tools.ToolContext(workspace, box, tools=offered)
        run = agent_loop.run_agent(
            client, config.eval.model, task.problem_statement, ctx, tools=offered,
            max_turns=config.env.max_turns, max_tokens=config.sampling.max_turn_tokens,
            temperature=config.eval.temperature, out=io.StringIO(),
        )  # fmt: skip
        grade = reward.grade(
            task, workspace, edited_files=ctx.edited_files, tool_errors=run.tool_errors,
            first_edit_after_read=tools.first_edit_after_read(run.turn_calls), isolation=config.env.isolation,
        )  # fmt: skip
        return {"reward": grade.reward, "turns": len(run.turn_calls) + 1, "stop": run.stop,
                "tool_errors": run.tool_errors}  # fmt: skip
    except Exception as e:  # an episode that cannot run is counted apart, never scored 0
        logging.warning("EVAL: %s could not be run: %s: %s", task.instance_id, type(e).__name__, e)
        return {"reward": None, "error": f"{type(e).__name__}: {e}"}
    finally:
        if box is not None:
            box.close()
        sandbox.remove_workspace(workspace)


def run(config: ml_collections.ConfigDict, workdir: Path) -> dict:
    """Evaluates the endpoint's model on eval.tasks; prints the summary line last and returns it."""
    import openai

    eval_suite.check(config)
    if not config.eval.model:
        raise ValueError("eval.endpoint needs eval.model: the endpoint's name of the model")
    isolation.settle(config, workdir)
    suite = suites.load(config.eval.tasks)
    tasks = suite[: config.eval.n_tasks]
    client = openai.OpenAI(
        base_url=config.eval.endpoint,
        api_key=os.environ.get("OPENAI_API_KEY", "none"),
        max_retries=2,
        timeout=600,
    )
    n = config.eval.samples_per_task
    jobs = [(task, i) for task in tasks for i in range(n)]
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(max(config.env.n_workers, 1)) as pool:
        results = list(pool.map(lambda job: (job[0].instance_id, episode(client, config, job[0])), jobs))
    by_task = collections.defaultdict(list)
    for task_id, result in results:
        by_task[task_id].append(result)
    summary = eval_suite.summarize({t: [r["reward"] for r in rs] for t, rs in by_task.items()})
    name = Path(config.eval.tasks).expanduser().resolve().name
    out = workdir / "eval_suites" / f"{name}-endpoint-{config.eval.model.replace('/', '_')}"
    out.mkdir(parents=True, exist_ok=True)
    stats = {"wall_s": time.time() - t0, "endpoint": config.eval.endpoint, "model": config.eval.model,
             "suite": str(config.eval.tasks), "samples_per_task": n, "temperature": config.eval.temperature,
             "not_run": sum(r["reward"] is None for _, r in results)}  # fmt: skip
    (out / "results.json").write_text(json.dumps({**summary, "stats": stats}, indent=1))
    with (out / "tasks.jsonl").open("w") as f:
        for task_id, rs in by_task.items():
            f.write(json.dumps({"instance_id": task_id, "episodes": rs}) + "\n")
    logging.info("EVAL: %d of %d tasks solved by %s at %s; results in %s", summary["solved"],
                 summary["tasks"], config.eval.model, config.eval.endpoint, out)  # fmt: skip
    print(json.dumps(summary), flush=True)
    return summary
