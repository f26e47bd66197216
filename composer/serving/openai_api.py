"""The OpenAI-compatible HTTP API (FastAPI) over a serving Engine.

    GET  /v1/models
    POST /v1/chat/completions   messages (system, user, assistant with tool_calls, tool), tools, tool_choice
                                ('auto' | 'none' | 'required' | a named function: the turn starts
                                with the call, up to its arguments for a named one), temperature,
                                top_p, max_tokens / max_completion_tokens, stop, seed, n, stream
                                (server-sent events of chat.completion.chunk), logprobs
    POST /v1/completions        token-exact: `prompt` as token ids (or text); each choice carries the
                                generated `token_ids` and their log-probs, so a client never re-tokenises

Conversations are rendered in the model's own chat format (env/chat.py: the tools' JSON schemas in the
system turn, calls as `<tool_call>` JSON blocks, results as `<tool_response>` blocks), and an assistant
turn is parsed back into OpenAI `tool_calls` (arguments as a JSON string). A malformed request is a 400
in OpenAI's error shape, naming what is wrong; a prompt longer than the context is a 400 naming the limit.
"""

import asyncio
import json
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from composer.pipeline import rollouts
from composer.serving.engine import Engine, Handle
from env import chat
from env.tokenizer import render_prompt

_FINISH = {"eos": "stop", "length": "length"}


class BadRequest(ValueError):
    """A request the API refuses: a 400 whose message names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status_code=status)


def _number(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise BadRequest(f"'{name}' must be a number in [{low}, {high}], got {value!r}", name)
    return float(value)


def _integer(body: dict, names: tuple[str, ...], default: int, low: int, high: int) -> int:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise BadRequest(f"'{name}' must be an integer in [{low}, {high}], got {value!r}", name)
        return value
    return default


def _stops(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
        raise BadRequest("'stop' must be a non-empty string or a list of up to 4 of them", "stop")
    return stops


def _tool_schemas(body: dict, compact: bool) -> list[dict]:
    tools = body.get("tools") or []
    choice = body.get("tool_choice", "auto")
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be a list", "tools")
    schemas = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or tool.get("type", "function") != "function" or not fn.get("name"):
            raise BadRequest(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}", f"tools[{i}]"
            )
        # The client's schema as given (its key order too: a checkpoint's template prints it as JSON).
        schema = {"type": "function", "function": dict(fn)}
        schema["function"].setdefault("parameters", {"type": "object", "properties": {}})
        schemas.append(rollouts.compact_schema(schema) if compact else schema)
    return [] if choice == "none" else schemas


def forced_call(body: dict) -> str:
    """The start of the assistant turn that `tool_choice` forces, appended to the prompt: '' for 'auto' and
    'none'; for 'required' the opening of a call; for a named function the call up to its arguments."""
    choice = body.get("tool_choice", "auto")
    if choice in ("auto", "none"):
        return ""
    names = [t.get("function", {}).get("name") for t in body.get("tools") or [] if isinstance(t, dict)]
    if not names:
        raise BadRequest("'tool_choice' forces a call: give the 'tools' it may call", "tool_choice")
    if choice == "required":
        return f'{chat.TOOL_CALL_OPEN}\n{{"name": "'
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(fn, dict):
        raise BadRequest(
            "'tool_choice' must be 'auto', 'none', 'required' or "
            "{'type': 'function', 'function': {'name': ...}}",
            "tool_choice",
        )
    if fn.get("name") not in names:
        raise BadRequest(
            f"'tool_choice' names {fn.get('name')!r}, which is not one of 'tools'", "tool_choice"
        )
    return f'{chat.TOOL_CALL_OPEN}\n{{"name": {json.dumps(fn["name"])}, "arguments": '


def _arguments(raw: Any, where: str) -> dict:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw)
    except (TypeError, json.JSONDecodeError) as e:
        raise BadRequest(f"{where}.function.arguments is not a JSON object: {e}", where) from None
    if not isinstance(value, dict):
        raise BadRequest(f"{where}.function.arguments is not a JSON object", where)
    return value


def to_messages(body: dict, compact: bool) -> list[chat.Message]:
    """The request's conversation as env.chat Messages, its tools' schemas in the system turn."""
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty list", "messages")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in (
            "system",
            "developer",
            "user",
            "assistant",
            "tool",
        ):
            raise BadRequest(
                f"messages[{i}].role must be system, developer, user, assistant or tool", f"messages[{i}]"
            )
        content = m.get("content") or ""
        if isinstance(content, list):  # content parts: the text ones
            content = "".join(
                p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
            )
        if not isinstance(content, str):
            raise BadRequest(
                f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}]"
            )
        calls = []
        for j, call in enumerate(m.get("tool_calls") or []):
            where = f"messages[{i}].tool_calls[{j}]"
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise BadRequest(f"{where} must have function.name and function.arguments", where)
            calls.append(chat.ToolCall(fn["name"], _arguments(fn.get("arguments", "{}"), where)))
        reasoning = m.get("reasoning_content")
        if m["role"] == "assistant" and isinstance(reasoning, str) and reasoning:
            # What the model wrote before its answer, back where it wrote it (a template may keep or drop it).
            content = f"{chat.THINK_OPEN}\n{reasoning}\n{chat.THINK_CLOSE}\n\n{content}"
        role = "system" if m["role"] == "developer" else m["role"]
        messages.append(chat.Message(role, content, calls))
    schemas = _tool_schemas(body, compact)
    if messages[0].role == "system":
        messages[0] = chat.system_message(schemas, messages[0].content)
    elif schemas:
        messages.insert(0, chat.system_message(schemas, ""))
    return messages


def _tool_calls(calls: list) -> list[dict]:
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
        }
        for c in calls
        if isinstance(c, chat.ToolCall)
    ]


def _cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    cuts = [text.index(s) for s in stops if s in text]
    return (text[: min(cuts)], True) if cuts else (text, False)


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _safe_prefix(text: str, markers: list[str]) -> int:
    """How much of `text` can be shown: up to the first marker in it, and short of a tail that could be
    the start of one."""
    cut = len(text)
    for marker in markers:
        at = text.find(marker)
        if at != -1:
            cut = min(cut, at)
        for k in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:k]):
                cut = min(cut, len(text) - k)
                break
    return cut


def _logprobs(tokenizer, ids: list[int], logprobs: list[float]) -> dict:
    content = []
    for i, lp in zip(ids, logprobs, strict=True):
        token = tokenizer.decode([i])
        content.append({"token": token, "logprob": lp, "bytes": list(token.encode()), "top_logprobs": []})
    return {"content": content}


class Api:
    """The request handlers over one engine (module docstring)."""

    def __init__(self, engine: Engine, model_name: str) -> None:
        self.engine, self.model_name = engine, model_name
        self.tok = engine.tokenizer
        self.compact = engine.config.env.tool_schemas == "compact"
        self.created = int(time.time())

    def _prompt(self, body: dict) -> tuple[list[int], list[chat.Message]]:
        messages = to_messages(body, self.compact)
        ids = render_prompt(messages, self.tok).tolist()
        if len(ids) >= self.engine.max_len:
            raise BadRequest(
                f"the prompt is {len(ids)} tokens; this model's context is {self.engine.max_len} tokens",
                "messages",
            )
        return ids, messages

    def _sampling(self, body: dict, prompt_len: int) -> dict:
        room = self.engine.max_len - prompt_len
        return dict(
            max_new=_integer(body, ("max_completion_tokens", "max_tokens"), room, 1, room),
            temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=_number(body, "top_p", 1.0, 1e-6, 1.0),
            seed=body.get("seed") if isinstance(body.get("seed"), int) else None,
        )

    def _submit(self, body: dict, ids: list[int]) -> list[Handle]:
        n = _integer(body, ("n",), 1, 1, 16)
        kw = self._sampling(body, len(ids))
        seed = kw.pop("seed")
        return [self.engine.submit(ids, seed=None if seed is None else seed * 16 + i, **kw) for i in range(n)]

    def _message(self, out, stops: list[str], tools_on: bool, forced: str = "") -> tuple[dict, str]:
        text = forced + self.tok.decode(out.token_ids)
        text, stopped = _cut_at_stop(text, stops)
        finish = "stop" if stopped else _FINISH[out.stop]
        # A turn that opens with a think block (Qwen3's templates): the block is reasoning_content.
        reasoning, answer = chat.split_reasoning(text)
        parsed = self.tok.chat_format.parse_assistant(answer)
        calls = _tool_calls(parsed.calls) if tools_on else []
        if calls and not stopped:
            message, finish = (
                {"role": "assistant", "content": parsed.text or None, "tool_calls": calls},
                "tool_calls",
            )
        else:
            message = {
                "role": "assistant",
                "content": answer.split(chat.IM_END)[0] if not tools_on else parsed.text,
            }
        if reasoning:
            message["reasoning_content"] = reasoning
        return message, finish

    async def chat_completions(self, body: dict):
        ids, _ = self._prompt(body)
        stops = _stops(body)
        tools_on = bool(body.get("tools")) and body.get("tool_choice", "auto") != "none"
        forced = forced_call(body)  # the model continues a call it was made to start
        ids = ids + self.tok.encode(forced) if forced else ids
        handles = self._submit(body, ids)
        rid, want_logprobs = f"chatcmpl-{uuid.uuid4().hex}", bool(body.get("logprobs"))
        if body.get("stream"):
            return StreamingResponse(
                self._stream(rid, handles, stops, tools_on, forced), media_type="text/event-stream"
            )
        outs = await asyncio.gather(*(asyncio.to_thread(h.result) for h in handles))
        choices = []
        for i, out in enumerate(outs):
            message, finish = self._message(out, stops, tools_on, forced)
            choice = {"index": i, "message": message, "finish_reason": finish, "logprobs": None}
            if want_logprobs:
                choice["logprobs"] = _logprobs(self.tok, out.token_ids, out.logprobs)
            choices.append(choice)
        completion = sum(len(o.token_ids) for o in outs)
        return {
            "id": rid, "object": "chat.completion", "created": int(time.time()), "model": self.model_name,
            "choices": choices,
            "usage": _usage(len(ids), completion),
        }  # fmt: skip

    async def _stream(self, rid: str, handles: list[Handle], stops: list[str], tools_on: bool, forced: str):
        """Chunks as OpenAI streams them: the role, content deltas as tokens arrive (held back while they
        may open a tool call or a stop string), the tool calls once the turn is done, the finish reason."""
        created = int(time.time())

        def chunk(i: int, delta: dict, finish: str | None = None) -> str:
            choice = {"index": i, "delta": delta, "finish_reason": finish, "logprobs": None}
            body = {"id": rid, "object": "chat.completion.chunk", "created": created}
            body.update(model=self.model_name, choices=[choice])
            return f"data: {json.dumps(body)}\n\n"

        completion = 0
        for i, handle in enumerate(handles):
            yield chunk(i, {"role": "assistant", "content": ""})
            ids: list[int] = []
            shown = shown_reasoning = 0
            events = handle.events
            while True:
                event = await asyncio.to_thread(events.get)
                if event[0] == "error":
                    yield f"data: {json.dumps({'error': {'message': event[1], 'type': 'server_error'}})}\n\n"
                    return
                if event[0] == "tokens":
                    ids += event[1]
                    text = (forced + self.tok.decode(ids)).split(chat.IM_END)[0]
                    head = text.lstrip()
                    if chat.THINK_OPEN.startswith(head):  # nothing yet, or a think block's tag arriving
                        continue
                    if head.startswith(chat.THINK_OPEN):
                        thought, answer = chat.split_reasoning(text)
                        closed = chat.THINK_CLOSE in head
                        if not closed:  # short of a closing tag that may be arriving
                            thought = thought[: _safe_prefix(thought, [chat.THINK_CLOSE])].rstrip("\n")
                        if len(thought) > shown_reasoning:
                            yield chunk(i, {"reasoning_content": thought[shown_reasoning:]})
                            shown_reasoning = len(thought)
                        if not closed:
                            continue
                        text = answer
                    # Text that may still become a tool call or a stop string waits for the end of the turn.
                    safe = _safe_prefix(text, ([chat.TOOL_CALL_OPEN] if tools_on else []) + stops)
                    if safe > shown:
                        yield chunk(i, {"content": text[shown:safe]})
                        shown = safe
                    continue
                out = event[1]
                completion += len(out.token_ids)
                message, finish = self._message(out, stops, tools_on, forced)
                thought = message.get("reasoning_content", "")[shown_reasoning:]
                if thought:
                    yield chunk(i, {"reasoning_content": thought})
                rest = (message.get("content") or "")[shown:] if "tool_calls" not in message else ""
                if rest:
                    yield chunk(i, {"content": rest})
                for k, call in enumerate(message.get("tool_calls", [])):
                    yield chunk(i, {"tool_calls": [{"index": k, **call}]})
                yield chunk(i, {}, finish)
                break
        yield "data: [DONE]\n\n"

    async def completions(self, body: dict):
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            ids = self.tok.encode(prompt)
        elif (
            isinstance(prompt, list)
            and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            ids = list(prompt)
            if max(ids) >= self.engine.cfg.vocab_size or min(ids) < 0:
                raise BadRequest(f"prompt token ids must be in [0, {self.engine.cfg.vocab_size})", "prompt")
        else:
            raise BadRequest("'prompt' must be a string or a non-empty list of token ids", "prompt")
        if len(ids) >= self.engine.max_len:
            raise BadRequest(
                f"the prompt is {len(ids)} tokens; this model's context is {self.engine.max_len} tokens",
                "prompt",
            )
        handles = self._submit(body, ids)
        outs = await asyncio.gather(*(asyncio.to_thread(h.result) for h in handles))
        choices = [
            {
                "index": i, "text": self.tok.decode(o.token_ids), "finish_reason": _FINISH[o.stop],
                "token_ids": list(o.token_ids),
                "logprobs": {
                    "tokens": [self.tok.decode([t]) for t in o.token_ids], "token_logprobs": list(o.logprobs)
                },
            }
            for i, o in enumerate(outs)
        ]  # fmt: skip
        completion = sum(len(o.token_ids) for o in outs)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": self.model_name, "choices": choices, "prompt_token_ids": ids,
            "usage": _usage(len(ids), completion),
        }  # fmt: skip


def make_app(engine: Engine, model_name: str) -> FastAPI:
    """The FastAPI app of `engine`, serving it as `model_name`."""
    api = Api(engine, model_name)
    app = FastAPI(title="composer", docs_url=None, redoc_url=None)

    async def body_of(request: Request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadRequest("the request body is not JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        if body.get("model") not in (None, model_name):
            raise BadRequest(
                f"this server serves the model {model_name!r}, not {body.get('model')!r}", "model"
            )
        return body

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, e: BadRequest):
        return _error(400, str(e), "invalid_request_error", e.param)

    @app.exception_handler(RuntimeError)
    async def failed(request: Request, e: RuntimeError):
        return _error(500, str(e), "server_error")

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "created": api.created, "owned_by": "composer"}],
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await api.chat_completions(await body_of(request))

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await api.completions(await body_of(request))

    return app
