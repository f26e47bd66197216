"""read_file, write, search_replace, delete_file against the templates of docs/tools.md."""

import os
import stat

import pytest

from env.chat import ToolCall
from env.tools import ToolContext, ToolResult, execute


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    (root / "empty.txt").write_text("")
    return root


def call(ctx, name, **arguments) -> ToolResult:
    return execute(ctx, ToolCall(name, arguments))


def numbered(lines, first=1):
    return "\n".join(f"{n:>6}|{t}" for n, t in enumerate(lines, first))


# ------------------------------------------------------------------------------------------- read_file


def test_read_whole_file_numbers_every_line(ws):
    r = call(ToolContext(ws), "read_file", target_file="pkg/mod.py")
    assert r == ToolResult(numbered([f"line {i}" for i in range(1, 11)]))
    assert r.text.splitlines()[0] == "     1|line 1"


def test_partial_read_is_framed_on_the_hidden_sides(ws):
    ctx = ToolContext(ws)
    r = call(ctx, "read_file", target_file="pkg/mod.py", offset=4, limit=3)
    expected = "... 3 lines not shown ...\n" + numbered(["line 4", "line 5", "line 6"], 4)
    assert r.text == expected + "\n... 4 lines not shown ..."
    head = call(ctx, "read_file", target_file="pkg/mod.py", offset=0, limit=2)  # 0 is treated as 1
    assert head.text == numbered(["line 1", "line 2"]) + "\n... 8 lines not shown ..."
    tail = call(ctx, "read_file", target_file="/workspace/pkg/mod.py", offset=9)
    assert tail.text == "... 8 lines not shown ...\n" + numbered(["line 9", "line 10"], 9)
    assert not (r.is_error or head.is_error or tail.is_error)


def test_empty_file(ws):
    assert call(ToolContext(ws), "read_file", target_file="empty.txt") == ToolResult("File is empty.")


def test_missing_file_is_an_error(ws):
    assert call(ToolContext(ws), "read_file", target_file="nope.py") == ToolResult(
        "Error: File not found", True
    )


def test_file_over_100000_characters_is_not_shown(ws):
    (ws / "big.txt").write_text("x" * 99 + "\n" + "y" * 100_000 + "\n")
    r = call(ToolContext(ws), "read_file", target_file="big.txt")
    assert r.text.startswith(
        "File content (100101 characters) exceeds maximum allowed characters (100000 characters)."
    )
    assert "offset" in r.text and "grep" in r.text and "yyy" not in r.text
    part = call(ToolContext(ws), "read_file", target_file="big.txt", limit=1)
    assert part.text == numbered(["x" * 99]) + "\n... 1 lines not shown ..."


def test_offset_past_the_end_and_directories_are_errors(ws):
    ctx = ToolContext(ws)
    r = call(ctx, "read_file", target_file="pkg/mod.py", offset=11)
    assert r.is_error and "beyond the end of the file (10 lines)" in r.text
    d = call(ctx, "read_file", target_file="pkg")
    assert d.is_error and "directory" in d.text


def test_crlf_and_missing_final_newline(ws):
    (ws / "w.txt").write_bytes(b"a\r\nb\r\nc")
    assert call(ToolContext(ws), "read_file", target_file="w.txt").text == numbered(["a", "b", "c"])


# ----------------------------------------------------------------------------------------------- write


def test_write_creates_file_and_directories(ws):
    ctx = ToolContext(ws)
    r = call(ctx, "write", file_path="new/dir/a.py", contents="x = 1\ny = 2\n")
    assert r == ToolResult(
        "The file new/dir/a.py has been updated. Here's a relevant snippet of the edited file:\n\n"
        + numbered(["x = 1", "y = 2"])
    )
    assert (ws / "new/dir/a.py").read_text() == "x = 1\ny = 2\n"
    assert ctx.edited_files == {"new/dir/a.py"}


def test_write_overwrites_atomically_keeping_mode_and_breaking_hard_links(ws, tmp_path):
    target = ws / "pkg" / "mod.py"
    os.chmod(target, 0o751)
    original = tmp_path / "original.py"  # e.g. the task's repo, which the workspace hard-links
    os.link(target, original)
    r = call(ToolContext(ws), "write", file_path="/workspace/pkg/mod.py", contents="new\n")
    assert not r.is_error
    assert target.read_text() == "new\n"
    assert original.read_text().startswith("line 1\n")
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o751
    assert [p.name for p in (ws / "pkg").iterdir()] == ["mod.py"]  # no temporary file left


def test_long_write_shows_a_framed_snippet(ws):
    r = call(
        ToolContext(ws), "write", file_path="long.py", contents="".join(f"v{i} = {i}\n" for i in range(100))
    )
    assert r.text.endswith("    60|v59 = 59\n... 40 lines not shown ...")


def test_write_to_a_directory_is_an_error(ws):
    r = call(ToolContext(ws), "write", file_path="pkg", contents="x")
    assert r.is_error and "directory" in r.text


# -------------------------------------------------------------------------------------- search_replace


def test_search_replace_unique(ws):
    ctx = ToolContext(ws)
    r = call(ctx, "search_replace", file_path="pkg/mod.py", old_string="line 7\n", new_string="seven\n")
    lines = [f"line {i}" for i in range(1, 11)]
    lines[6] = "seven"
    assert r == ToolResult(
        "The file pkg/mod.py has been updated. Here's a relevant snippet of the edited file:\n\n"
        "... 2 lines not shown ...\n" + numbered(lines[2:10], 3)
    )
    assert (ws / "pkg/mod.py").read_text().splitlines() == lines
    assert ctx.edited_files == {"pkg/mod.py"}


def test_search_replace_absent_string(ws):
    ctx = ToolContext(ws)
    r = call(ctx, "search_replace", file_path="pkg/mod.py", old_string="line 11", new_string="x")
    assert r.is_error and r.text.startswith("Error: old_string not found in pkg/mod.py")
    assert ctx.edited_files == set()


def test_search_replace_ambiguous_string_and_replace_all(ws):
    ctx = ToolContext(ws)
    r = call(ctx, "search_replace", file_path="pkg/mod.py", old_string="line 1", new_string="L1")
    assert r.is_error and r.text.startswith("Error: old_string occurs 2 times in pkg/mod.py")  # 1 and 10
    assert (ws / "pkg/mod.py").read_text().startswith("line 1\n")
    r = call(
        ctx, "search_replace", file_path="pkg/mod.py", old_string="line", new_string="row", replace_all=True
    )
    assert not r.is_error
    assert (ws / "pkg/mod.py").read_text() == "".join(f"row {i}\n" for i in range(1, 11))
    assert r.text.endswith(numbered([f"row {i}" for i in range(1, 11)]))


def test_search_replace_rejects_identical_strings_and_missing_files(ws):
    ctx = ToolContext(ws)
    same = call(ctx, "search_replace", file_path="pkg/mod.py", old_string="line 2", new_string="line 2")
    assert same.is_error and "must differ" in same.text
    missing = call(ctx, "search_replace", file_path="nope.py", old_string="a", new_string="b")
    assert missing == ToolResult("Error: File not found", True)


def test_search_replace_deleting_text(ws):
    r = call(ToolContext(ws), "search_replace", file_path="pkg/mod.py", old_string="line 5\n", new_string="")
    assert not r.is_error
    assert "line 5" not in (ws / "pkg/mod.py").read_text()
    assert "     5|line 6" in r.text


# ----------------------------------------------------------------------------------------- delete_file


def test_delete_file(ws):
    ctx = ToolContext(ws)
    r = call(ctx, "delete_file", target_file="/workspace/pkg/mod.py")
    assert r == ToolResult("Successfully deleted file: pkg/mod.py (71 bytes)")
    assert not (ws / "pkg/mod.py").exists()
    assert ctx.edited_files == {"pkg/mod.py"}


def test_delete_missing_file(ws):
    assert call(ToolContext(ws), "delete_file", target_file="gone.py") == ToolResult(
        "File not found: gone.py", True
    )


def test_delete_refuses_directories(ws):
    r = call(ToolContext(ws), "delete_file", target_file="pkg")
    assert r.is_error and (ws / "pkg").is_dir()


def test_delete_permission_denied(ws, monkeypatch):
    def refuse(path, *a, **k):
        raise PermissionError(path)

    monkeypatch.setattr(os, "unlink", refuse)
    r = call(ToolContext(ws), "delete_file", target_file="empty.txt")
    assert r == ToolResult("Permission denied: empty.txt", True)
