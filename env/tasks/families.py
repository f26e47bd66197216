"""Bug families: the ways one function of a generated module is broken.

Each family enumerates candidate mutations of one function. A candidate is located on the AST and applied
as a text splice of the original source (only the mutated tokens change, so the gold fix is a one- or
two-line diff and the rest of the file keeps its layout). Every splice is checked: the mutated text must
parse to exactly the AST obtained by applying the same change to the tree; a splice that would change
precedence is retried with parentheses and dropped if it still does not match.

Whether a candidate changes behaviour seen by a test is decided by the generator, which runs the tests.
"""

import ast
import copy
import dataclasses
from collections.abc import Iterable, Iterator

FAMILIES: tuple[str, ...] = (
    "wrong_operator",
    "off_by_one",
    "wrong_constant",
    "swapped_arguments",
    "negated_condition",
    "wrong_variable",
    "missing_return",
    "early_return",
)

_SYMBOL = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.And: "and",
    ast.Or: "or",
}
# Operators a typo or a slip of thought turns into one another (same precedence class, so a splice of the
# symbol alone never regroups the expression).
_ARITH = {
    ast.Add: (ast.Sub,),
    ast.Sub: (ast.Add,),
    ast.Mult: (ast.Div, ast.FloorDiv),
    ast.Div: (ast.Mult, ast.FloorDiv),
    ast.FloorDiv: (ast.Div, ast.Mod),
    ast.Mod: (ast.FloorDiv,),
}
_ORDER_FLIP = {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE}
_STRICTNESS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_NEGATE = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}


@dataclasses.dataclass(frozen=True)
class Mutation:
    """One candidate bug: the whole module text with the bug, where it is, and what changed."""

    family: str
    source: str
    line: int  # 1-based line of the change in the buggy text
    description: str


def find_function(tree: ast.Module, qualname: str) -> ast.FunctionDef:
    """The function (`name`) or method (`Class.name`) defined at the top of `tree`."""
    scope: list[ast.stmt] = tree.body
    *outer, name = qualname.split(".")
    for part in outer:
        scope = next(n for n in scope if isinstance(n, ast.ClassDef) and n.name == part).body
    for node in scope:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise KeyError(f"no function {qualname}")


def check_families(names: Iterable[str]) -> tuple[str, ...]:
    """`names` as a tuple, once each is known to be a bug family (else ValueError naming the others)."""
    names = tuple(names)
    unknown = [f for f in names if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown bug families {unknown}; known: {', '.join(FAMILIES)}")
    return names


def parse_families(text: str) -> tuple[str, ...]:
    """Bug families from a comma-separated list ('': none chosen, i.e. all of them), checked by name."""
    return check_families(f.strip() for f in text.split(",") if f.strip())


def mutations(source: str, qualname: str, family: str, callables: frozenset[str]) -> list[Mutation]:
    """Every checked candidate of `family` inside function `qualname` of `source`, in source order.

    `callables`: names of the package's own functions and methods (swapped_arguments swaps arguments of
    calls to these only; builtins like max() are symmetric or fail loudly).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown bug family {family!r}")
    tree = ast.parse(source)
    fn = find_function(tree, qualname)
    text = _Text(source)
    out = []
    seen = set()
    for edits, change, description in _CANDIDATES[family](fn, text, callables):
        for wrap in (False, True):
            spliced = text.apply(edits, wrap)
            if spliced is None or spliced in seen:
                continue
            if _same_ast(spliced, source, qualname, change):
                seen.add(spliced)
                line = min(e[0][0] for e in edits)
                out.append(Mutation(family, spliced, line, description))
                break
    return out


# ------------------------------------------------------------------------------------------- text splices

# An edit replaces the text between two (line, col) positions; `wrappable` edits may be parenthesised.
Edit = tuple[tuple[int, int], tuple[int, int], str, bool]


class _Text:
    def __init__(self, source: str):
        self.source = source
        self.starts = [0]
        for line in source.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, pos: tuple[int, int]) -> int:
        return self.starts[pos[0] - 1] + pos[1]  # generated sources are ASCII: bytes == characters

    def segment(self, node: ast.AST) -> str:
        return self.source[self.offset(_start(node)) : self.offset(_end(node))]

    def apply(self, edits: list[Edit], wrap: bool) -> str | None:
        if wrap and not any(e[3] for e in edits):
            return None
        out = self.source
        for start, end, new, wrappable in sorted(edits, key=lambda e: e[0], reverse=True):
            if wrap and wrappable:
                new = f"({new})"
            out = out[: self.offset(start)] + new + out[self.offset(end) :]
        return out


def _start(node: ast.AST) -> tuple[int, int]:
    return node.lineno, node.col_offset


def _end(node: ast.AST) -> tuple[int, int]:
    return node.end_lineno, node.end_col_offset


def _same_ast(spliced: str, source: str, qualname: str, change) -> bool:
    """Whether `spliced` parses to the original tree with `change` applied to its function `qualname`."""
    try:
        got = ast.parse(spliced)
    except SyntaxError:
        return False
    want = ast.parse(source)
    change(find_function(want, qualname))
    return ast.dump(got) == ast.dump(want)


def _path(fn: ast.AST, node: ast.AST) -> list[tuple[str, int | None]]:
    """Field path from `fn` down to `node` (to find the twin of `node` in a copy of the tree)."""

    def search(cur: ast.AST, trail: list) -> list | None:
        if cur is node:
            return trail
        for field, value in ast.iter_fields(cur):
            if isinstance(value, list):
                for i, item in enumerate(value):
                    if (
                        isinstance(item, ast.AST)
                        and (found := search(item, trail + [(field, i)])) is not None
                    ):
                        return found
            elif isinstance(value, ast.AST) and (found := search(value, trail + [(field, None)])) is not None:
                return found
        return None

    return search(fn, [])


def _follow(root: ast.AST, path: list[tuple[str, int | None]]) -> ast.AST:
    for field, i in path:
        root = getattr(root, field) if i is None else getattr(root, field)[i]
    return root


def _replace(root: ast.AST, path: list[tuple[str, int | None]], new: ast.AST) -> None:
    parent = _follow(root, path[:-1])
    field, i = path[-1]
    if i is None:
        setattr(parent, field, new)
    else:
        getattr(parent, field)[i] = new


def _nodes(fn: ast.FunctionDef) -> Iterator[ast.AST]:
    """Nodes of the function body, skipping the docstring and anything inside f-strings (whose inner
    positions are not reliable on every Python version)."""
    body = fn.body[1:] if _docstring(fn) else fn.body
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.JoinedStr):
            continue
        yield node
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _docstring(fn: ast.FunctionDef) -> bool:
    first = fn.body[0]
    return (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )


def _op_edit(text: _Text, left: ast.AST, right: ast.AST, old: type, new: type) -> Edit | None:
    """The edit that turns the operator token between `left` and `right` into `new`."""
    gap_start, gap_end = text.offset(_end(left)), text.offset(_start(right))
    gap = text.source[gap_start:gap_end]
    symbol = _SYMBOL[old]
    at = gap.find(symbol)
    if at < 0 or gap.count(symbol) != 1:
        return None
    line = text.source.count("\n", 0, gap_start + at) + 1
    col = gap_start + at - text.starts[line - 1]
    return (line, col), (line, col + len(symbol)), _SYMBOL[new], False


def _set(path, field, value, index=None):
    """A change function: sets `field` (or `field[index]`) of the node at `path`."""

    def change(fn_copy: ast.AST) -> None:
        node = _follow(fn_copy, path)
        if index is None:
            setattr(node, field, value)
        else:
            getattr(node, field)[index] = value

    return change


# -------------------------------------------------------------------------------------------- the families


def _wrong_operator(fn, text, callables):
    for node in _nodes(fn):
        path = _path(fn, node)
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
            for new in _ARITH[type(node.op)]:
                edit = _op_edit(text, node.left, node.right, type(node.op), new)
                if edit:
                    yield [edit], _set(path, "op", new()), f"'{_SYMBOL[type(node.op)]}' -> '{_SYMBOL[new]}'"
        elif isinstance(node, ast.AugAssign) and type(node.op) in (ast.Add, ast.Sub):
            new = ast.Sub if isinstance(node.op, ast.Add) else ast.Add
            edit = _op_edit(text, node.target, node.value, type(node.op), new)
            if edit:
                yield [edit], _set(path, "op", new()), f"'{_SYMBOL[type(node.op)]}=' -> '{_SYMBOL[new]}='"
        elif isinstance(node, ast.Compare):
            yield from _compare_swaps(fn, node, path, text, _ORDER_FLIP)
        elif isinstance(node, ast.BoolOp):
            new = ast.Or if isinstance(node.op, ast.And) else ast.And
            edits = [_op_edit(text, a, b, type(node.op), new) for a, b in zip(node.values, node.values[1:])]
            if all(edits):
                yield edits, _set(path, "op", new()), f"'{_SYMBOL[type(node.op)]}' -> '{_SYMBOL[new]}'"


def _compare_swaps(fn, node, path, text, table):
    operands = [node.left, *node.comparators]
    for i, op in enumerate(node.ops):
        new = table.get(type(op))
        if new is None:
            continue
        edit = _op_edit(text, operands[i], operands[i + 1], type(op), new)
        if edit:
            yield [edit], _set(path, "ops", new(), i), f"'{_SYMBOL[type(op)]}' -> '{_SYMBOL[new]}'"


def _plus_minus_one(fn, text, node, path):
    """Candidates moving an integer bound by one: `x` -> `x + 1` / `x - 1`, `x - 1` -> `x`, `k` -> `k + 1`."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        for new in (node.value + 1, node.value - 1):
            if new < 0:
                continue
            yield (
                [(_start(node), _end(node), repr(new), False)],
                _const(fn, path, new),
                f"{node.value} -> {new}",
            )
    elif (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Add | ast.Sub)
        and isinstance(node.right, ast.Constant)
        and node.right.value == 1
    ):
        left = copy.deepcopy(node.left)
        yield (
            [(_start(node), _end(node), text.segment(node.left), True)],
            _swap_node(fn, path, left),
            f"'{text.segment(node)}' -> '{text.segment(node.left)}'",
        )
    elif isinstance(node, ast.Name | ast.Attribute | ast.Call | ast.Subscript):
        seg = text.segment(node)
        for op, sym in ((ast.Add, "+"), (ast.Sub, "-")):
            new = ast.BinOp(copy.deepcopy(node), op(), ast.Constant(1))
            yield (
                [(_start(node), _end(node), f"{seg} {sym} 1", True)],
                _swap_node(fn, path, new),
                f"'{seg}' -> '{seg} {sym} 1'",
            )


def _const(fn, path, value):
    return _swap_node(fn, path, ast.Constant(value))


def _swap_node(fn, path, new):
    def change(fn_copy):
        _replace(fn_copy, path, copy.deepcopy(new))

    return change


def _off_by_one(fn, text, callables):
    for node in _nodes(fn):
        path = _path(fn, node)
        if isinstance(node, ast.Compare):
            yield from _compare_swaps(fn, node, path, text, _STRICTNESS)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
            if node.args and not node.keywords and len(node.args) <= 2:
                bound = node.args[-1]
                yield from _plus_minus_one(fn, text, bound, _path(fn, bound))
                if len(node.args) == 2:
                    yield from _plus_minus_one(fn, text, node.args[0], _path(fn, node.args[0]))
        elif isinstance(node, ast.Subscript):
            parts = (
                [node.slice]
                if not isinstance(node.slice, ast.Slice)
                else [node.slice.lower, node.slice.upper]
            )
            for part in parts:
                if part is not None and not isinstance(part, ast.Tuple | ast.Slice):
                    if isinstance(part, ast.UnaryOp) and isinstance(part.operand, ast.Constant):
                        if isinstance(part.op, ast.USub) and type(part.operand.value) is int:
                            # x[-k] -> x[-(k + 1)]
                            k = part.operand.value
                            new = ast.UnaryOp(ast.USub(), ast.Constant(k + 1))
                            change = _swap_node(fn, _path(fn, part), new)
                            yield (
                                [(_start(part), _end(part), f"-{k + 1}", False)],
                                change,
                                f"-{k} -> -{k + 1}",
                            )
                    else:
                        yield from _plus_minus_one(fn, text, part, _path(fn, part))


def _wrong_constant(fn, text, callables):
    in_bounds = set()
    for node in _nodes(fn):
        if isinstance(node, ast.Subscript):
            in_bounds.update(id(n) for n in ast.walk(node.slice))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
            in_bounds.update(id(n) for a in node.args for n in ast.walk(a))
    for node in _nodes(fn):
        if not isinstance(node, ast.Constant) or id(node) in in_bounds:
            continue
        value = node.value
        if type(value) is int and value not in (0, 1):
            options = [value * 10, value + 1] + (
                [value // 10] if value >= 10 and value % 10 == 0 else [value - 1]
            )
        elif type(value) is float:
            options = [round(value * 10, 6), round(value / 10, 6), round(value + 0.5, 6)]
        else:
            continue
        for new in dict.fromkeys(options):
            if new != value:
                yield (
                    [(_start(node), _end(node), repr(new), False)],
                    _const(fn, _path(fn, node), new),
                    f"{value!r} -> {new!r}",
                )


def _swapped_arguments(fn, text, callables):
    for node in _nodes(fn):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
        if name not in callables or any(isinstance(a, ast.Starred) for a in node.args):
            continue
        path = _path(fn, node)
        for i in range(len(node.args) - 1):
            a, b = node.args[i], node.args[i + 1]
            sa, sb = text.segment(a), text.segment(b)
            if sa == sb:
                continue

            def change(fn_copy, path=path, i=i):
                call = _follow(fn_copy, path)
                call.args[i], call.args[i + 1] = call.args[i + 1], call.args[i]

            edits = [(_start(a), _end(a), sb, False), (_start(b), _end(b), sa, False)]
            yield edits, change, f"arguments {i + 1} and {i + 2} of {name}() swapped"


def _negated_condition(fn, text, callables):
    tests = []
    for node in _nodes(fn):
        if isinstance(node, ast.If | ast.IfExp | ast.While):
            tests.append(node.test)
        elif isinstance(node, ast.comprehension):
            tests.extend(node.ifs)
    for test in tests:
        yield from _negations(fn, text, test)
        if isinstance(test, ast.BoolOp):
            for value in test.values:
                yield from _negations(fn, text, value)


def _negations(fn, text, test):
    path = _path(fn, test)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _NEGATE:
        yield from _compare_swaps(fn, test, path, text, _NEGATE)
    elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        operand = copy.deepcopy(test.operand)
        seg = text.segment(test.operand)
        yield (
            [(_start(test), _end(test), seg, True)],
            _swap_node(fn, path, operand),
            f"'not {seg}' -> '{seg}'",
        )
    elif not isinstance(test, ast.BoolOp):
        seg = text.segment(test)
        new = ast.UnaryOp(ast.Not(), copy.deepcopy(test))
        yield (
            [(_start(test), _end(test), f"not {seg}", True)],
            _swap_node(fn, path, new),
            f"'{seg}' -> 'not {seg}'",
        )


def _local_names(fn: ast.FunctionDef) -> dict[str, int]:
    """Variables of the function (not comprehension or lambda scopes): name -> first line where bound."""
    args = fn.args
    bound = {
        a.arg: fn.lineno
        for a in args.posonlyargs + args.args + args.kwonlyargs
        if a.arg not in ("self", "cls")
    }
    for node in _nodes(fn):
        if isinstance(node, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
            continue
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign | ast.For):
            targets = [node.target]
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name) and n.id not in bound and n.id != "_":
                    bound[n.id] = node.end_lineno
    return bound


def _wrong_variable(fn, text, callables):
    names = _local_names(fn)
    scoped = set()
    for node in _nodes(fn):
        if isinstance(node, ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp):
            scoped.update(id(n) for n in ast.walk(node))
        if isinstance(node, ast.Call):
            scoped.add(id(node.func))
    for node in _nodes(fn):
        if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load) or id(node) in scoped:
            continue
        if node.id not in names:
            continue
        for other, line in names.items():
            if other != node.id and line < node.lineno:
                new = ast.Name(other, ast.Load())
                yield (
                    [(_start(node), _end(node), other, False)],
                    _swap_node(fn, _path(fn, node), new),
                    f"{node.id} -> {other}",
                )


def _missing_return(fn, text, callables):
    last = fn.body[-1]
    real = fn.body[1:] if _docstring(fn) else fn.body
    if len(real) >= 2 and isinstance(last, ast.Return) and isinstance(last.value, ast.Name):
        start, end = (last.lineno, 0), (last.end_lineno + 1, 0)

        def change(fn_copy):
            fn_copy.body.pop()

        yield [(start, end, "", False)], change, f"'return {last.value.id}' removed"


def _early_return(fn, text, callables):
    body = fn.body
    if len(body) < 2 or not isinstance(body[-1], ast.Return) or not isinstance(body[-2], ast.For | ast.While):
        return
    ret, loop = body[-1], body[-2]
    if loop.orelse or ret.lineno != ret.end_lineno:
        return
    indent = " " * loop.body[0].col_offset
    line = text.source.splitlines(keepends=True)[ret.lineno - 1].lstrip()

    def change(fn_copy):
        moved = fn_copy.body.pop()
        fn_copy.body[-1].body.append(moved)

    # Delete the return line and insert it, one level deeper, right after the loop's last line.
    edits = [
        ((ret.lineno, 0), (ret.lineno + 1, 0), "", False),
        ((loop.end_lineno + 1, 0), (loop.end_lineno + 1, 0), indent + line, False),
    ]
    if loop.end_lineno + 1 == ret.lineno:
        edits = [((ret.lineno, 0), (ret.lineno + 1, 0), indent + line, False)]
    yield edits, change, "final return moved into the loop body"


_CANDIDATES = {
    "wrong_operator": _wrong_operator,
    "off_by_one": _off_by_one,
    "wrong_constant": _wrong_constant,
    "swapped_arguments": _swapped_arguments,
    "negated_condition": _negated_condition,
    "wrong_variable": _wrong_variable,
    "missing_return": _missing_return,
    "early_return": _early_return,
}
