"""Workspace path resolution: accepted forms, and escapes refused by every file tool."""

import os

import pytest

from env.chat import ToolCall
from env.tools import ToolContext, execute
from env.tools.paths import PathError, resolve_path


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("x = 1\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    os.symlink(outside, root / "out_dir")
    os.symlink(outside / "secret.txt", root / "out_file")
    os.symlink(root / "pkg" / "mod.py", root / "alias.py")  # a link that stays inside
    return root


@pytest.mark.parametrize(
    "raw, rel",
    [
        ("pkg/mod.py", "pkg/mod.py"),
        ("./pkg/../pkg/mod.py", "pkg/mod.py"),
        ("/workspace/pkg/mod.py", "pkg/mod.py"),
        ("//workspace//pkg/mod.py", "pkg/mod.py"),
        ("/workspace", "."),
        (".", "."),
    ],
)
def test_accepted_forms(ws, raw, rel):
    wp = resolve_path(ToolContext(ws), raw)
    assert wp.rel == rel
    assert wp.host == (ws if rel == "." else ws / rel)
    assert wp.display == ("/workspace" if rel == "." else f"/workspace/{rel}")


@pytest.mark.parametrize(
    "raw",
    ["../outside/secret.txt", "pkg/../../outside/secret.txt", "/etc/passwd", "/workspace/../etc/passwd",
     "/workspacex/a", "out_dir/secret.txt", "out_file", "out_dir", "", "   "],
)  # fmt: skip
def test_escapes_are_refused(ws, raw):
    with pytest.raises(PathError):
        resolve_path(ToolContext(ws), raw)


def test_link_inside_the_workspace_is_followed(ws):
    wp = resolve_path(ToolContext(ws), "alias.py")
    assert wp.rel == "alias.py" and wp.real_rel == "pkg/mod.py"


@pytest.mark.parametrize(
    "name, arguments",
    [
        ("read_file", {"target_file": "../outside/secret.txt"}),
        ("read_file", {"target_file": "out_file"}),
        ("read_file", {"target_file": "/etc/passwd"}),
        ("write", {"file_path": "out_dir/new.txt", "contents": "x"}),
        ("write", {"file_path": "../outside/new.txt", "contents": "x"}),
        ("search_replace", {"file_path": "out_file", "old_string": "secret", "new_string": "s"}),
        ("delete_file", {"target_file": "out_dir/secret.txt"}),
        ("grep", {"pattern": "secret", "path": "out_dir"}),
        ("glob_file_search", {"glob_pattern": "*.txt", "target_directory": "/tmp"}),
        ("list_dir", {"target_directory": "out_dir"}),
        ("read_lints", {"paths": ["../outside"]}),
        ("codebase_search", {"query": "secret", "target_directories": ["out_dir"]}),
    ],
)
def test_every_tool_refuses_escapes(ws, tmp_path, name, arguments):
    ctx = ToolContext(ws)
    r = execute(ctx, ToolCall(name, arguments))
    assert r.is_error and "outside the workspace" in r.text
    assert "secret\n" not in r.text
    assert sorted(p.name for p in (tmp_path / "outside").iterdir()) == ["secret.txt"]
    assert (tmp_path / "outside" / "secret.txt").read_text() == "secret\n"
    assert ctx.edited_files == set()


def test_searches_do_not_follow_links_out(ws):
    ctx = ToolContext(ws)
    grep = execute(ctx, ToolCall("grep", {"pattern": "secret"}))
    assert grep.text == "No matches found"
    tree = execute(ctx, ToolCall("list_dir", {"target_directory": "."})).text
    assert "secret.txt" not in tree and "- out_dir\n" in tree  # shown as an entry, not entered
