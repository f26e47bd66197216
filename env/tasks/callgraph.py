"""Who calls whom in a generated package: the graph the generator uses to place a bug at a given call depth
below the functions a test calls, and to name the call chain from the test to the bug."""

import ast

Graph = dict[str, set[str]]


def call_graph(sources: dict[str, str]) -> tuple[Graph, dict[str, str], dict[str, str], dict[str, str]]:
    """(qualname -> qualnames it calls, qualname -> dotted module, function or class name -> qualname (a
    class: its __init__), method name -> qualname)."""
    top: dict[str, str] = {}
    methods: dict[str, str] = {}
    where: dict[str, str] = {}
    bodies: dict[str, ast.AST] = {}
    for module, text in sources.items():
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef):
                top[node.name] = node.name
                where[node.name], bodies[node.name] = module, node
            elif isinstance(node, ast.ClassDef):
                top[node.name] = f"{node.name}.__init__"
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        qual = f"{node.name}.{item.name}"
                        if item.name != "__init__":
                            methods[item.name] = qual
                        where[qual], bodies[qual] = module, item
    graph = {q: calls(body, top, methods) for q, body in bodies.items()}
    return graph, where, top, methods


def calls(node: ast.AST, top: dict[str, str], methods: dict[str, str]) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            if isinstance(n.func, ast.Name) and n.func.id in top:
                out.add(top[n.func.id])
            elif isinstance(n.func, ast.Attribute) and n.func.attr in methods:
                out.add(methods[n.func.attr])
    return out


def distances(graph: dict[str, set[str]], starts: set[str]) -> dict[str, int]:
    dist = {s: 0 for s in starts}
    frontier = list(starts)
    while frontier:
        nxt = []
        for q in frontier:
            for callee in graph.get(q, ()):
                if callee not in dist:
                    dist[callee] = dist[q] + 1
                    nxt.append(callee)
        frontier = nxt
    return dist


def chain(graph: dict[str, set[str]], starts: set[str], target: str) -> list[str]:
    """A shortest call path from one of `starts` to `target`."""
    parent: dict[str, str | None] = {s: None for s in sorted(starts)}
    frontier = sorted(starts)
    while frontier and target not in parent:
        nxt = []
        for q in frontier:
            for callee in sorted(graph.get(q, ())):
                if callee not in parent:
                    parent[callee] = q
                    nxt.append(callee)
        frontier = nxt
    path = [target]
    while parent[path[-1]] is not None:
        path.append(parent[path[-1]])
    return path[::-1]
