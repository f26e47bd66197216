"""Mutation kinds of the real-project builder on small code: what each produces, as minimal edits."""

import ast

import pytest

from env.tasks.build.mutations import KINDS, candidates
from env.tasks.diffs import make_diff

MODULE = '''"""A module with a bit of everything."""
import math

LIMIT = 10  # not inside a function: never mutated


def clamp(x, lo, hi):
    """Clamp x into [lo, hi]."""
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


def total(items, scale):
    result = 0
    for item in items:
        result += item * scale
    return result


def window(seq, n):
    out = []
    for i in range(len(seq) - n + 1):
        out.append(seq[i : i + n])
    return out


def describe(name, values):
    label = name.strip()
    label = label.title()  # café
    if not values:
        raise ValueError("no values")
    count = len(values)
    return label, count


class Box:
    def __init__(self, width, height):
        self.width = width
        self.height = height

    def area(self):
        return self.width * self.height

    def ratio(self):
        return divide(self.width, self.height)


def divide(a, b):
    return a / b


def find(items, target):
    for i, item in enumerate(items):
        if item == target:
            return i
    return -1


def percent(x):
    return x * 100
'''


def _changed(new: str) -> tuple[list[str], list[str]]:
    diff = make_diff("m.py", new, MODULE).splitlines()
    removed = [line[1:] for line in diff if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in diff if line.startswith("+") and not line.startswith("+++")]
    return removed, added


def _load(source: str) -> dict:
    scope: dict = {}
    exec(compile(source, "m.py", "exec"), scope)
    return scope


@pytest.mark.parametrize(
    ("kind", "qualname", "before", "after"),
    [
        ("operator_swap", "total", "        result += item * scale", "        result -= item * scale"),
        ("comparison_flip", "clamp", "    if x < lo:", "    if x > lo:"),
        ("off_by_one", "clamp", "    if x < lo:", "    if x <= lo:"),
        ("negated_condition", "clamp", "    if x < lo:", "    if x >= lo:"),
        ("swapped_arguments", "Box.ratio", "        return divide(self.width, self.height)",
         "        return divide(self.height, self.width)"),
        ("wrong_return", "describe", "    return label, count", None),
        ("wrong_return", "clamp", "        return lo", "        return hi"),
        ("dropped_statement", "describe", "    label = label.title()  # café", ""),
        ("wrong_constant", "percent", "    return x * 100", "    return x * 1000"),
        ("wrong_variable", "divide", "    return a / b", "    return b / b"),
        ("missing_return", "total", "    return result", ""),
        ("early_return", "window", None, None),
    ],
)  # fmt: skip
def test_each_kind_is_a_minimal_edit(kind, qualname, before, after):
    found = candidates(MODULE, qualname, kind, frozenset({"divide"}))
    if after is None and kind == "wrong_return":
        assert found == []  # a tuple is returned, not a variable
        return
    assert found, kind
    first = found[0]
    assert first.kind == kind
    ast.parse(first.source)
    removed, added = _changed(first.source)
    assert 1 <= len(removed) + len(added) <= 3
    if before is not None:
        assert added == [before]
        assert removed == ([after] if after else [])
    assert candidates(MODULE, qualname, kind, frozenset({"divide"})) == found  # deterministic


def test_early_return_moves_the_final_return_into_the_loop():
    (cand,) = candidates(MODULE, "window", "early_return")
    assert _load(cand.source)["window"]([1, 2, 3], 2) == [[1, 2]]
    assert _load(MODULE)["window"]([1, 2, 3], 2) == [[1, 2], [2, 3]]


def test_dropped_statement_keeps_blocks_valid_and_skips_first_bindings():
    found = candidates(MODULE, "describe", "dropped_statement")
    texts = [c.description for c in found]
    # the raise is alone in its block: `pass` takes its place; `label = name.strip()` is a first binding
    assert any("raise ValueError" in t for t in texts)
    assert not any("name.strip()" in t for t in texts)
    raise_drop = next(c for c in found if "raise ValueError" in c.description)
    removed, added = _changed(raise_drop.source)
    assert removed == ["        pass"] and added == ['        raise ValueError("no values")']
    assert _load(raise_drop.source)["describe"]("x", []) == ("X", 0)


def test_non_ascii_lines_are_edited_at_the_right_column():
    # the comment holds a two-byte character after the statement: its end column is counted in bytes
    (drop,) = [c for c in candidates(MODULE, "describe", "dropped_statement") if "title" in c.description]
    assert "label.title()" not in drop.source and "# café" not in drop.source
    assert drop.source.count("\n") == MODULE.count("\n") - 1


def test_only_the_function_changes():
    for kind in KINDS:
        for cand in candidates(MODULE, "clamp", kind):
            before = MODULE.split("def clamp")[0]
            after = MODULE.split("def total")[1]
            assert cand.source.startswith(before) and cand.source.endswith(after), (kind, cand.description)


def test_methods_and_unknown_functions():
    assert candidates(MODULE, "Box.area", "operator_swap")
    assert candidates(MODULE, "nothing", "operator_swap") == []
    assert candidates("def f(:\n", "f", "operator_swap") == []
    with pytest.raises(ValueError, match="unknown mutation kind"):
        candidates(MODULE, "clamp", "bogus")
