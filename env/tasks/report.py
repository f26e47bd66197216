"""The user's bug report of a generated task, and the Python literals it (and the generated code) is written
with.

The report is built from one failing test: the snippet the user ran (only public entry points), what it
returned or raised, and the correct value. It never names the file or function to fix: `leaks` finds a
report that would, and the generator drops that draft.
"""

import ast
import re


def literal(value) -> str:
    """A Python literal for `value`, strings in double quotes (the house style of the generated code)."""
    if isinstance(value, str):
        return (
            '"' + value.replace("\\", "\\\\") + '"' if '"' not in value and "\n" not in value else repr(value)
        )
    if isinstance(value, list):
        return "[" + ", ".join(map(literal, value)) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(map(literal, value)) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def is_literal(value) -> bool:
    try:
        back = ast.literal_eval(literal(value))
    except (ValueError, SyntaxError):
        return False
    return back == value and literal(back) == literal(value)


_TITLES = (
    "Wrong result for {about}",
    "Unexpected value for {about}",
    "Bug: wrong value for {about}",
    "Problem with {about}",
    "Incorrect result for {about}",
)
_INTROS = ("Steps to reproduce:", "I ran this:", "Minimal example:", "To reproduce:", "Here is what I did:")
_CLOSINGS = ("", "", "Other calls seem fine.", "Could you take a look?", "The rest of the package works.")


def statement(draft, bug) -> str:
    """The report of `draft`'s test `bug.shown` (a generator draft and bug); draws its wording from
    `draft.rng`, so the generator's draws stay in the same order."""
    rng = draft.rng
    test = draft.tests[bug.shown]
    outcome = bug.outcomes[bug.shown]
    title = rng.choice(_TITLES).format(about=test.about)
    used = [n for n in re.findall(r"\b\w+\b", "\n".join([*test.setup, test.expr])) if n in draft.exports]
    header = f"from {draft.package} import {', '.join(sorted(set(used)))}\n"
    if test.raises is not None:
        code = [*test.setup, test.expr]
        if outcome.error is not None:
            result = f"The last line raises `{outcome.error}` instead of a `{test.raises}`."
        else:
            result = f"I expected the last line to raise a `{test.raises}`, but no error is raised."
    else:
        code = [*test.setup, f"result = {test.expr}"]
        want = literal(test.expected)
        if outcome.error is not None:
            result = f"The last line raises `{outcome.error}`; `result` should be `{want}`."
        else:
            got = literal(outcome.value)
            result = rng.choice(
                (
                    f"`result` is `{got}`, but it should be `{want}`.",
                    f"I get `{got}` for `result`; the correct value is `{want}`.",
                    f"Expected `result == {want}`, got `{got}`.",
                )
            )
    snippet = header + "\n" + "\n".join(code)
    closing = rng.choice(_CLOSINGS)
    parts = [title, "", rng.choice(_INTROS), "", "```python", snippet, "```", "", result]
    if closing:
        parts += ["", closing]
    return "\n".join(parts)


def leaks(draft, bug, statement: str) -> bool:
    """Whether the report names the file or function to fix (beyond the entry points the user called)."""
    called_names = {q.split(".")[-1] for q in bug.chain[:1]} | {q.split(".")[0] for q in bug.chain[:1]}
    fn_name = bug.qualname.split(".")[-1]
    module = bug.module.split(".")[-1]
    if fn_name not in called_names and re.search(rf"\b{re.escape(fn_name)}\b", statement):
        return True
    return f"{module}.py" in statement or bug.module in statement
