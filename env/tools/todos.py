"""todo_write: the episode's todo list (`ctx.todos`), replaced or merged by id.

Rules (each broken rule is an error result and leaves the list unchanged): every call has at least 2 items
(the schema's minItems), ids are unique within a call and non-empty, contents are non-empty, and the
resulting list has at most one item in_progress. With merge, an item whose id is already listed replaces
that item's content and status in place; new ids are appended in the order given. Without merge the list
becomes the given items.
"""

import json

from env.tools.context import ToolContext, ToolError, ToolResult

REMINDER = (
    "Keep the list current: mark each item completed as soon as it is done, keep at most one item "
    "in_progress, and add or cancel items when the plan changes."
)


def todo_write(ctx: ToolContext, args: dict) -> ToolResult:
    items = [{"id": t["id"], "content": t["content"], "status": t["status"]} for t in args["todos"]]
    ids = [t["id"] for t in items]
    if len(set(ids)) != len(ids):
        duplicated = sorted({i for i in ids if ids.count(i) > 1})
        raise ToolError(f"Error: todo_write: duplicate todo ids {duplicated}")
    for t in items:
        if not t["id"].strip():
            raise ToolError("Error: todo_write: a todo id is empty")
        if not t["content"].strip():
            raise ToolError(f"Error: todo_write: todo '{t['id']}' has empty content")
    with ctx.todo_lock:
        if args["merge"]:
            merged = [dict(t) for t in ctx.todos]
            position = {t["id"]: i for i, t in enumerate(merged)}
            for t in items:
                if t["id"] in position:
                    merged[position[t["id"]]] = t
                else:
                    merged.append(t)
        else:
            merged = items
        in_progress = [t["id"] for t in merged if t["status"] == "in_progress"]
        if len(in_progress) > 1:
            raise ToolError(
                "Error: todo_write: at most one todo may be in_progress; the list would have "
                f"{len(in_progress)} ({', '.join(in_progress)})"
            )
        ctx.todos = merged
    text = f"Successfully updated TODOs. {REMINDER}"
    if args["merge"]:
        text += (
            f"\n\nHere are the latest contents of your todo list:\n{json.dumps(merged, ensure_ascii=False)}"
        )
    return ToolResult(text)
