"""The OpenAI-compatible server, through the official `openai` client: a tiny random model served from a
workdir's tokenizer (what it says is noise; the API's shape, batching and errors are what is tested), and
the same app over an engine that replays fixed turns, for tool calls the random model never makes."""

import concurrent.futures
import json

import httpx
import openai
import pytest
from serving_helpers import Replay, Server

from composer.pipeline import learner as learner_lib
from composer.serving import load, openai_api
from env import chat
from experiments import composer as experiment

LONG = " ".join(str(i) for i in range(3000))  # far beyond the context
CALL = '<tool_call>\n{"name": "grep", "arguments": {"pattern": "def add"}}\n</tool_call>'


def _config():
    config = experiment.get_config("tiny")
    config.model.update(copy_head_dim=0, copy_head_lines=False)
    config.sampling.update(decode_slots=8, max_turn_tokens=32, steps_per_call=4)
    config.env.max_episode_tokens = 1024
    return config


def _tokenizer(config):
    texts = [
        chat.render_text([chat.Message("user", "fix add in calc.py"), chat.Message("assistant", CALL)])
    ] * 20
    return learner_lib.fit_tokenizer(config, texts + ["def add(a, b):\n    return a + b\n"] * 20)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    config = _config()
    workdir = tmp_path_factory.mktemp("run")
    _tokenizer(config).save(workdir / "tokenizer.json")
    app, engine = load.build(config, str(workdir), "tiny")
    server = Server(app)
    yield server, engine
    server.close()
    engine.close()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[0].url, api_key="none", max_retries=0)


def test_models_and_a_completion_with_usage(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "fix add"}], max_tokens=8, temperature=0.0
    )
    assert r.object == "chat.completion" and len(r.choices) == 1
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length") and choice.message.role == "assistant"
    assert r.usage.completion_tokens <= 8 and r.usage.prompt_tokens > 3
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    again = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "fix add"}], max_tokens=8, temperature=0.0
    )
    assert again.choices[0].message.content == choice.message.content  # greedy: the same tokens


def test_a_conversation_with_tool_calls_and_results_goes_in(client):
    messages = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": "fix add"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "grep", "arguments": '{"pattern": "x"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "calc.py:1:def add(a, b):"},
    ]  # fmt: skip
    parameters = {"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]}
    tools = [{"type": "function", "function": {"name": "grep", "parameters": parameters}}]
    r = client.chat.completions.create(
        model="tiny", messages=messages, tools=tools, max_tokens=6, logprobs=True
    )
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert len(r.choices[0].logprobs.content) == r.usage.completion_tokens


def test_n_seed_and_streaming(client):
    kw = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=1.0)
    r = client.chat.completions.create(n=3, seed=7, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    same = client.chat.completions.create(n=3, seed=7, **kw)
    assert [c.message.content for c in same.choices] == [c.message.content for c in r.choices]
    whole = client.chat.completions.create(seed=11, **kw)
    chunks = list(client.chat.completions.create(seed=11, stream=True, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == (whole.choices[0].message.content or "")


def test_token_exact_completions_return_ids_and_logprobs(served):
    url = served[0].url
    body = {"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 5, "temperature": 0.0}
    r = httpx.post(f"{url}/completions", json=body, timeout=60).json()
    choice = r["choices"][0]
    assert r["prompt_token_ids"] == [5, 6, 7, 8] and 1 <= len(choice["token_ids"]) <= 5
    assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"])
    assert all(lp <= 0 for lp in choice["logprobs"]["token_logprobs"])


def test_requests_at_other_settings_share_the_one_sampler_and_draw_as_alone(served):
    """Greedy and sampled requests at two temperatures and a nucleus, sent together, decode in the same
    sampler (one KV cache) and give the tokens each gives alone."""
    settings = [
        dict(temperature=0.0),
        dict(temperature=0.7, seed=3),
        dict(temperature=1.3, top_p=0.8, seed=4),
    ]

    def one(kw):
        body = {"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 12, **kw}
        return httpx.post(f"{served[0].url}/completions", json=body, timeout=120).json()["choices"][0][
            "token_ids"
        ]

    alone = [one(kw) for kw in settings]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        together = list(pool.map(one, settings))
    assert together == alone
    assert one(dict(temperature=0.0, seed=9)) == alone[0]  # greedy is greedy whatever the seed
    assert len({tuple(t) for t in alone}) > 1  # the settings do change the draws
    assert not hasattr(served[1], "samplers")


def test_concurrent_requests_share_the_decode_steps(served, client):
    def one(i):
        return client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"task {i}"}], max_tokens=24, temperature=0.0
        )

    one(0)  # the sampler's programs compiled
    sampler = served[1].sampler

    def tokens_per_decode_step(requests) -> float:
        before = dict(sampler.counters)
        requests()
        steps = sampler.counters["decode_steps"] - before["decode_steps"]
        return (sampler.counters["decode_tokens"] - before["decode_tokens"]) / max(steps, 1)

    assert tokens_per_decode_step(lambda: [one(i) for i in range(4)]) <= 1.0  # one at a time: one row a step
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        together = tokens_per_decode_step(lambda: list(pool.map(one, range(4))))
    assert together > 1.5  # requests that arrive together are decoded in the same device steps


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 5}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        (
            {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
            "tool_choice",
        ),  # no tools
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "x"}}, "tool_choice"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools[0]"),
        ({"messages": [{"role": "user", "content": LONG}]}, "messages"),
        (
            {
                "messages": [
                    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}
                ]
            },
            "messages[0].tool_calls[0]",
        ),
        ({"model": "other", "messages": [{"role": "user", "content": "x"}]}, "model"),
    ],
)
def test_bad_requests_are_400s_naming_the_field(served, body, param):
    r = httpx.post(f"{served[0].url}/chat/completions", json={"model": "tiny", **body}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


def test_a_body_that_is_not_json_is_a_400_and_the_server_lives_on(served, client):
    r = httpx.post(f"{served[0].url}/chat/completions", content=b"{not json", timeout=60)
    assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
    with pytest.raises(openai.BadRequestError, match="context"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": LONG}])
    assert client.models.list().data


def test_tool_calls_come_out_as_openai_tool_calls_and_stream_after_the_text():
    config = _config()
    tokenizer = _tokenizer(config)
    engine = Replay(tokenizer, config, ["Looking.\n" + CALL, "Looking.\n" + CALL, "Done: it was a - b."])
    server = Server(openai_api.make_app(engine, "tiny"))
    try:
        client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
        tools = [{"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}}]
        kw = dict(model="tiny", messages=[{"role": "user", "content": "fix add"}], tools=tools)
        r = client.chat.completions.create(**kw)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content == "Looking."
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "grep" and call.id.startswith("call_")
        assert json.loads(call.function.arguments) == {"pattern": "def add"}
        chunks = list(client.chat.completions.create(stream=True, **kw))
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert "<tool_call>" not in text and text.strip() == "Looking."
        calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
        assert [tc.function.name for tc in calls] == ["grep"] and chunks[-1].choices[
            0
        ].finish_reason == "tool_calls"
        last = client.chat.completions.create(**kw)
        assert (
            last.choices[0].message.content == "Done: it was a - b."
            and not last.choices[0].message.tool_calls
        )
    finally:
        server.close()


def test_a_named_tool_choice_makes_the_turn_a_call_of_that_tool():
    config = _config()
    tokenizer = _tokenizer(config)
    args = '{"pattern": "def add"}}\n</tool_call>'  # what the model writes after the forced start
    engine = Replay(tokenizer, config, [args, args])
    server = Server(openai_api.make_app(engine, "tiny"))
    try:
        client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
        tools = [
            {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
            for name in ("grep", "read_file")
        ]
        kw = dict(model="tiny", messages=[{"role": "user", "content": "fix add"}], tools=tools)
        r = client.chat.completions.create(
            tool_choice={"type": "function", "function": {"name": "grep"}}, **kw
        )
        (call,) = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "grep"
        assert json.loads(call.function.arguments) == {"pattern": "def add"}
        forced = tokenizer.encode('<tool_call>\n{"name": "grep", "arguments": ')
        assert engine.prompts[-1][-len(forced) :] == forced  # the prompt ends with the call's start
        with pytest.raises(openai.BadRequestError, match="not one of 'tools'"):
            client.chat.completions.create(
                tool_choice={"type": "function", "function": {"name": "edit"}}, **kw
            )
    finally:
        server.close()


def test_a_checkpoint_template_serves_its_own_prompts_and_reasoning():
    """A Qwen3-format model: every prompt is transformers' apply_chat_template of the request (tools and
    an earlier turn's reasoning included), and a turn's think block comes back as reasoning_content."""
    transformers = pytest.importorskip("transformers")
    from pathlib import Path

    from env.chat_format import TemplateFormat
    from env.tokenizer import Tokenizer

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    template = (fixtures / "chat_templates" / "qwen3.jinja").read_text()
    tokenizer = Tokenizer.load(fixtures / "hf" / "qwen3_moe" / "tokenizer.json")
    tokenizer.chat_format = TemplateFormat.load(template)
    reference = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(fixtures / "hf" / "qwen3_moe" / "tokenizer.json")
    )
    turn = "<think>\nThe sign.\n</think>\n\nLooking.\n" + CALL
    config = _config()
    config.env.tool_schemas = "full"  # the client's schemas as they are, as a pretrained model was trained
    engine = Replay(tokenizer, config, [turn, turn, "<think>\n\n</think>\n\nDone."])
    server = Server(openai_api.make_app(engine, "tiny"))
    try:
        client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
        tools = [{"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}}]
        messages = [{"role": "system", "content": "Fix bugs."}, {"role": "user", "content": "fix add"}]
        r = client.chat.completions.create(model="tiny", messages=messages, tools=tools)
        message = r.choices[0].message
        assert message.content == "Looking." and message.model_extra["reasoning_content"] == "The sign."
        assert [c.function.name for c in message.tool_calls] == ["grep"]
        chunks = list(
            client.chat.completions.create(model="tiny", messages=messages, tools=tools, stream=True)
        )
        deltas = [c.choices[0].delta for c in chunks]
        assert "".join((d.model_extra or {}).get("reasoning_content", "") for d in deltas) == "The sign."
        assert "".join(d.content or "" for d in deltas).strip() == "Looking."
        call = message.tool_calls[0]
        history = messages + [
            {"role": "assistant", "content": "Looking.", "reasoning_content": "The sign.",
             "tool_calls": [{"id": call.id, "type": "function",
                             "function": {"name": "grep", "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": "calc.py:1:def add(a, b):"},
        ]  # fmt: skip
        last = client.chat.completions.create(model="tiny", messages=history, tools=tools)
        assert last.choices[0].message.content == "Done." and not last.choices[0].message.tool_calls
        for sent, prompt in ((messages, engine.prompts[0]), (history, engine.prompts[-1])):
            text = reference.apply_chat_template(
                sent, tools=tools, chat_template=template, tokenize=False, add_generation_prompt=True
            )
            assert tokenizer.decode(prompt) == text, (tokenizer.decode(prompt), text)
            assert prompt == tokenizer.encode(text)
        assert "<think>\nThe sign.\n</think>\n\nLooking." in tokenizer.decode(engine.prompts[-1])
    finally:
        server.close()
