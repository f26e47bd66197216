"""Bugs injected into one function of a real module, as minimal source edits.

Kinds: the generated-task families of env/tasks/families.py (every one is a plain AST rewrite that applies
to any Python function), with `wrong_operator` split into arithmetic/boolean swaps (operator_swap) and
flipped comparisons (comparison_flip), plus two kinds that real code calls for:

    wrong_return        `return x` -> `return y`, y a local variable bound before the return
    dropped_statement   one statement of one or two lines removed (a call, a reassignment, an augmented or
                        attribute assignment, a raise), `pass` left where the block would be empty

Edits are made on the text of the top-level definition that holds the function (padded with blank lines
so line numbers stay those of the module), which keeps every AST check cheap on thousand-line modules, and
spliced back; everything outside the changed tokens keeps its bytes. Every candidate is checked: the edited
text must parse to exactly the original tree with the intended change applied.
"""

import ast
import dataclasses
import warnings
from collections.abc import Callable, Iterator

from env.tasks import families

_FROM_FAMILIES = {
    "operator_swap": "wrong_operator",
    "comparison_flip": "wrong_operator",
    "off_by_one": "off_by_one",
    "negated_condition": "negated_condition",
    "swapped_arguments": "swapped_arguments",
    "wrong_constant": "wrong_constant",
    "wrong_variable": "wrong_variable",
    "missing_return": "missing_return",
    "early_return": "early_return",
}
KINDS: tuple[str, ...] = (
    "operator_swap",
    "comparison_flip",
    "off_by_one",
    "negated_condition",
    "swapped_arguments",
    "wrong_return",
    "dropped_statement",
    "wrong_constant",
    "wrong_variable",
    "missing_return",
    "early_return",
)
_ORDER = ("'<'", "'>'", "'<='", "'>='")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One bug: the whole module text with it, the 1-based line where it is, and what changed."""

    kind: str
    source: str
    line: int
    description: str


def check_kinds(names) -> tuple[str, ...]:
    names = tuple(names)
    unknown = [k for k in names if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown mutation kinds {unknown}; known: {', '.join(KINDS)}")
    return names


def candidates(
    source: str, qualname: str, kind: str, callables: frozenset[str] = frozenset()
) -> list[Candidate]:
    """Every checked candidate of `kind` in function `qualname` ('f' or 'Class.method') of module `source`,
    in source order; [] when the function is not a top-level function or method (nested, async, defined
    under an `if`) or the module does not parse."""
    if kind not in KINDS:
        raise ValueError(f"unknown mutation kind {kind!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # real modules parse with SyntaxWarnings (e.g. '\\s' in a string)
        return _candidates(source, qualname, kind, callables)


def _candidates(source: str, qualname: str, kind: str, callables: frozenset[str]) -> list[Candidate]:
    try:
        tree = ast.parse(source)
        families.find_function(tree, qualname)
    except (SyntaxError, KeyError, StopIteration, ValueError):
        return []
    top = qualname.split(".")[0]
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == top)
    lines = source.splitlines(keepends=True)
    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
    region = "\n" * (first - 1) + "".join(lines[first - 1 : node.end_lineno])
    head, tail = "".join(lines[: first - 1]), "".join(lines[node.end_lineno :])
    if kind in _FROM_FAMILIES:
        found = [
            (m.source, m.line, m.description)
            for m in families.mutations(region, qualname, _FROM_FAMILIES[kind], callables)
            if kind not in ("operator_swap", "comparison_flip")
            or (kind == "comparison_flip") == m.description.startswith(_ORDER)
        ]
    else:
        found = list(_OWN[kind](region, qualname))
    out = []
    for text, line, description in found:
        body = "".join(text.splitlines(keepends=True)[first - 1 :])
        out.append(Candidate(kind, head + body + tail, line, description))
    return out


# ------------------------------------------------------------------------------------------------ checks


def _verify(edited: str, original: str, qualname: str, change: Callable[[ast.FunctionDef], None]) -> bool:
    """Whether `edited` parses to `original`'s tree with `change` applied to function `qualname`."""
    try:
        got = ast.parse(edited)
    except SyntaxError:
        return False
    want = ast.parse(original)
    change(families.find_function(want, qualname))
    return ast.dump(got) == ast.dump(want)


def _offsets(text: str) -> list[int]:
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def _char(text: str, starts: list[int], lineno: int, col: int) -> int:
    """Offset in `text` of the AST position (lineno, col), col counted in UTF-8 bytes as ast does."""
    line = text[starts[lineno - 1] : starts[lineno]]
    return starts[lineno - 1] + len(line.encode()[:col].decode(errors="ignore"))


def _statements(fn: ast.FunctionDef) -> Iterator[tuple[list[ast.stmt], int]]:
    """(block, index) of every statement in the function in source order, outside nested functions and
    classes."""

    def walk(block: list[ast.stmt]) -> Iterator[tuple[list[ast.stmt], int]]:
        for i, stmt in enumerate(block):
            yield block, i
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            inner = [getattr(stmt, field, None) for field in ("body", "orelse", "finalbody")]
            inner += [h.body for h in getattr(stmt, "handlers", [])] + [
                c.body for c in getattr(stmt, "cases", [])
            ]
            for sub in sorted(
                (b for b in inner if b and isinstance(b[0], ast.stmt)), key=lambda b: b[0].lineno
            ):
                yield from walk(sub)

    yield from walk(fn.body)


def _bound_names(fn: ast.FunctionDef) -> dict[str, int]:
    """Local variable -> first line where it is bound (arguments: the def line)."""
    args = fn.args
    bound = {
        a.arg: fn.lineno
        for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]
        if a is not None and a.arg not in ("self", "cls")
    }
    for block, i in _statements(fn):
        stmt = block[i]
        targets: list[ast.AST] = []
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, ast.AugAssign | ast.AnnAssign | ast.For):
            targets = [stmt.target]
        elif isinstance(stmt, ast.With):
            targets = [item.optional_vars for item in stmt.items if item.optional_vars is not None]
        for target in targets:
            for n in ast.walk(target):
                if isinstance(n, ast.Name) and n.id != "_":
                    bound[n.id] = min(bound.get(n.id, stmt.end_lineno), stmt.end_lineno)
    return bound


# --------------------------------------------------------------------------------------- the own kinds


def _wrong_return(source: str, qualname: str) -> Iterator[tuple[str, int, str]]:
    fn = families.find_function(ast.parse(source), qualname)
    bound = _bound_names(fn)
    starts = _offsets(source)
    for block, i in _statements(fn):
        ret = block[i]
        if not isinstance(ret, ast.Return) or not isinstance(ret.value, ast.Name):
            continue
        name = ret.value
        for other in sorted(bound, key=lambda n: (bound[n], n)):
            if other == name.id or bound[other] >= ret.lineno:
                continue
            a = _char(source, starts, name.lineno, name.col_offset)
            b = _char(source, starts, name.end_lineno, name.end_col_offset)
            edited = source[:a] + other + source[b:]

            def change(f, line=ret.lineno, old=name.id, new=other):
                for block2, j in _statements(f):
                    s = block2[j]
                    if isinstance(s, ast.Return) and s.lineno == line and getattr(s.value, "id", None) == old:
                        s.value.id = new

            if _verify(edited, source, qualname, change):
                yield edited, ret.lineno, f"'return {name.id}' -> 'return {other}'"


_DROPPABLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Raise)


def _dropped_statement(source: str, qualname: str) -> Iterator[tuple[str, int, str]]:
    fn = families.find_function(ast.parse(source), qualname)
    bound = _bound_names(fn)
    lines = source.splitlines(keepends=True)
    starts = _offsets(source)
    for block, i in _statements(fn):
        stmt = block[i]
        if not _droppable(stmt, bound, block is fn.body and i == 0):
            continue
        if stmt.end_lineno - stmt.lineno > 1 or not _alone(source, lines, starts, stmt):
            continue
        lone = len(block) == 1
        indent = lines[stmt.lineno - 1][: len(lines[stmt.lineno - 1]) - len(lines[stmt.lineno - 1].lstrip())]
        new = indent + "pass\n" if lone else ""
        edited = "".join(lines[: stmt.lineno - 1]) + new + "".join(lines[stmt.end_lineno :])
        path = _block_path(fn, block)

        def change(f, path=path, i=i, lone=lone):
            target = _follow(f, path)
            if lone:
                target[i] = ast.Pass()
            else:
                del target[i]

        if _verify(edited, source, qualname, change):
            text = lines[stmt.lineno - 1].strip()
            yield edited, stmt.lineno, f"statement removed: {text[:80]}"


def _droppable(stmt: ast.stmt, bound: dict[str, int], docstring_slot: bool) -> bool:
    if not isinstance(stmt, _DROPPABLE):
        return False
    if isinstance(stmt, ast.Expr):
        return isinstance(stmt.value, ast.Call | ast.Await) and not docstring_slot
    if isinstance(stmt, ast.AnnAssign) and stmt.value is None:
        return False
    if isinstance(stmt, ast.Assign | ast.AnnAssign):
        # Only reassignments and stores into attributes/items: dropping a first binding only gives a
        # NameError that points straight at the missing line.
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        for target in targets:
            for n in ast.walk(target):
                if (
                    isinstance(n, ast.Name)
                    and isinstance(n.ctx, ast.Store)
                    and bound.get(n.id, 10**9) >= stmt.lineno
                ):
                    return False
    return True


def _alone(source: str, lines: list[str], starts: list[int], stmt: ast.stmt) -> bool:
    """The statement fills its lines: nothing but indentation before it, nothing but a comment after."""
    before = lines[stmt.lineno - 1][
        : len(lines[stmt.lineno - 1].encode()[: stmt.col_offset].decode(errors="ignore"))
    ]
    end = _char(source, starts, stmt.end_lineno, stmt.end_col_offset)
    after = source[end : starts[stmt.end_lineno]].strip()
    return not before.strip() and (not after or after.startswith("#"))


def _block_path(fn: ast.AST, block: list[ast.stmt]) -> list[tuple[str, int | None]]:
    """Field path from `fn` to the list `block` (to find its twin in a fresh parse)."""

    def search(node: ast.AST, trail: list) -> list | None:
        for field, value in ast.iter_fields(node):
            if value is block:
                return trail + [(field, None)]
            if isinstance(value, list):
                for j, item in enumerate(value):
                    if (
                        isinstance(item, ast.AST)
                        and (found := search(item, trail + [(field, j)])) is not None
                    ):
                        return found
            elif isinstance(value, ast.AST) and (found := search(value, trail + [(field, None)])) is not None:
                return found
        return None

    return search(fn, []) or []


def _follow(node: ast.AST, path: list[tuple[str, int | None]]):
    for field, j in path:
        node = getattr(node, field) if j is None else getattr(node, field)[j]
    return node


_OWN = {"wrong_return": _wrong_return, "dropped_statement": _dropped_statement}
