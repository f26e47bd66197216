"""grep (real ripgrep), glob_file_search and list_dir against the templates of docs/tools.md."""

import os
import subprocess

import pytest

from env.chat import ToolCall
from env.tools import ToolContext, ToolResult, execute
from env.tools.binaries import find_binary
from env.tools.search import LIST_MAX_CHARS, MAX_OUTPUT_CHARS

HINT = "(Do a more specific search if needed)"


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text(
        "import os\n\ndef alpha():\n    return 1\n\n\ndef Beta():\n    return 2\n"
    )
    (root / "pkg" / "sub" / "b.py").write_text("x = 1\ndef gamma():\n    pass\n")
    (root / "notes.md").write_text("alpha notes\nmore\n")
    (root / ".hidden.py").write_text("def hidden():\n    pass\n")
    return root


def call(ctx, name, **arguments):
    return execute(ctx, ToolCall(name, arguments))


# ------------------------------------------------------------------------------------------------ grep


def test_grep_content_mode(ws):
    r = call(ToolContext(ws), "grep", pattern=r"def \w+")
    assert r == ToolResult("pkg/a.py:3:def alpha():\npkg/a.py:7:def Beta():\npkg/sub/b.py:2:def gamma():")


def test_grep_context_lines_and_separators(ws):
    r = call(ToolContext(ws), "grep", pattern="return", **{"-B": 1})
    assert r.text == (
        "pkg/a.py-3-def alpha():\npkg/a.py:4:    return 1\n--\n"
        "pkg/a.py-7-def Beta():\npkg/a.py:8:    return 2"
    )


@pytest.mark.parametrize(
    "arguments, flags",
    [
        ({"pattern": "def", "-C": 1}, ["-C", "1"]),
        ({"pattern": "alpha|gamma", "-A": 2}, ["-A", "2"]),
        ({"pattern": "beta", "-i": True}, ["-i"]),
        ({"pattern": r"alpha\(\):\n\s+return", "multiline": True}, ["-U", "--multiline-dotall"]),
        ({"pattern": "def", "type": "py", "-B": 2}, ["--type", "py", "-B", "2"]),
        ({"pattern": "a", "glob": "*.md"}, ["--glob", "*.md"]),
        ({"pattern": "def", "path": "pkg/sub"}, []),
    ],
)
def test_grep_content_is_ripgreps_own_layout(ws, arguments, flags):
    argv = [find_binary("rg"), "--no-heading", "-n", "--color=never", "--sort=path", *flags, "-e"]
    argv.append(arguments["pattern"])
    if "path" in arguments:
        argv.append(arguments["path"])
    expected = subprocess.run(argv, cwd=ws, capture_output=True, text=True, stdin=subprocess.DEVNULL).stdout
    assert expected  # the case is not vacuous
    r = call(ToolContext(ws), "grep", **arguments)
    assert r == ToolResult(expected.rstrip("\n"))


def test_grep_files_with_matches_and_count(ws):
    ctx = ToolContext(ws)
    files = call(ctx, "grep", pattern="def", output_mode="files_with_matches")
    assert files == ToolResult("pkg/a.py\npkg/sub/b.py")
    counts = call(ctx, "grep", pattern="return|pass", output_mode="count")
    assert counts == ToolResult("pkg/a.py:2\npkg/sub/b.py:1")
    single = call(ctx, "grep", pattern="def", output_mode="count", path="/workspace/pkg/a.py")
    assert single == ToolResult("pkg/a.py:2")


def test_grep_no_match_and_bad_regex(ws):
    ctx = ToolContext(ws)
    # Not an error, but flagged: a search that showed the model nothing (RL may penalise the turn).
    assert call(ctx, "grep", pattern="zzz_nothing") == ToolResult("No matches found", found_nothing=True)
    assert not call(ctx, "grep", pattern="def").found_nothing
    bad = call(ctx, "grep", pattern="(unclosed")
    assert bad.is_error and "regex parse error" in bad.text
    unknown_type = call(ctx, "grep", pattern="x", type="nolang")
    assert unknown_type.is_error
    missing = call(ctx, "grep", pattern="x", path="nope")
    assert missing.is_error and "not found" in missing.text


def test_grep_pattern_starting_with_a_dash(ws):
    (ws / "opts.txt").write_text("use --verbose here\n")
    assert call(ToolContext(ws), "grep", pattern="--verbose").text == "opts.txt:1:use --verbose here"


def test_grep_head_limit_says_at_least(ws):
    ctx = ToolContext(ws)
    r = call(ctx, "grep", pattern="def|return|pass", head_limit=2)
    assert r.text == (
        "pkg/a.py:3:def alpha():\npkg/a.py:4:    return 1\n"
        f"... at least 4 more matches in at least 2 files ... {HINT}"
    )
    files = call(ctx, "grep", pattern="def", output_mode="files_with_matches", head_limit=1)
    assert files.text == f"pkg/a.py\n... at least 1 more files ... {HINT}"


def test_grep_long_lines_are_cut(ws):
    (ws / "min.js").write_text("a" * 100 + "needle" + "b" * 5000 + "\n")
    r = call(ToolContext(ws), "grep", pattern="needle")
    assert r.text.startswith("min.js:1:" + "a" * 100 + "needle")
    assert r.text.endswith(" [... omitted end of long line]") and len(r.text) < 600


def test_grep_output_is_capped(ws):
    (ws / "big.txt").write_text("".join(f"match {i} " + "x" * 80 + "\n" for i in range(2000)))
    r = call(ToolContext(ws), "grep", pattern="match")
    body, trailer = r.text.rsplit("\n", 1)
    assert len(body) <= MAX_OUTPUT_CHARS
    shown = body.count("\n") + 1
    assert trailer == f"... at least {2000 - shown} more matches in at least 1 files ... {HINT}"
    assert body.splitlines()[-1].startswith(f"big.txt:{shown}:match {shown - 1} ")


# ------------------------------------------------------------------------------------ glob_file_search


def test_glob_newest_first_with_prepended_double_star(ws):
    for age, rel in enumerate(["pkg/sub/b.py", "pkg/a.py"]):  # b.py newest
        t = 1_700_000_000 - 100 * age
        os.utime(ws / rel, (t, t))
    r = call(ToolContext(ws), "glob_file_search", glob_pattern="*.py")
    assert r == ToolResult("Result of search in '/workspace' (total 2 files):\n- pkg/sub/b.py\n- pkg/a.py")
    sub = call(ToolContext(ws), "glob_file_search", glob_pattern="**/*.py", target_directory="pkg/sub")
    assert sub == ToolResult("Result of search in '/workspace/pkg/sub' (total 1 files):\n- b.py")


def test_glob_no_match(ws):
    r = call(ToolContext(ws), "glob_file_search", glob_pattern="*.rs")
    assert r == ToolResult("Result of search in '/workspace': 0 files found")


def test_glob_capped(ws):
    for i in range(105):
        (ws / f"f{i:03d}.txt").write_text("")
    lines = call(ToolContext(ws), "glob_file_search", glob_pattern="*.txt").text.splitlines()
    assert lines[0] == "Result of search in '/workspace' (total 105 files):"
    assert len(lines) == 102 and lines[-1] == f"... at least 5 more files ... {HINT}"


def test_glob_missing_directory(ws):
    r = call(ToolContext(ws), "glob_file_search", glob_pattern="*", target_directory="nope")
    assert r == ToolResult("Error: Directory not found: /workspace/nope", True)


# -------------------------------------------------------------------------------------------- list_dir


def test_list_dir_tree(ws):
    r = call(ToolContext(ws), "list_dir", target_directory="/workspace")
    assert r == ToolResult(
        "- /workspace/\n  - pkg/\n    - sub/\n      - b.py\n    - a.py\n  - notes.md"
    )  # fmt: skip
    sub = call(ToolContext(ws), "list_dir", target_directory="pkg", ignore_globs=["sub"])
    assert sub == ToolResult("- /workspace/pkg/\n  - a.py")
    deep = call(ToolContext(ws), "list_dir", target_directory=".", ignore_globs=["*.py", "*.md"])
    assert deep == ToolResult("- /workspace/\n  - pkg/\n    - sub/")


def test_list_dir_empty(ws):
    (ws / "empty").mkdir()
    (ws / "empty" / ".only_hidden").write_text("")
    assert call(ToolContext(ws), "list_dir", target_directory="empty") == ToolResult(
        "... no children found ..."
    )


def test_list_dir_large_directory_is_capped_breadth_first(ws):
    for i in range(30):
        d = ws / "big" / f"dir{i:02d}"
        d.mkdir(parents=True)
        for j in range(40):
            (d / f"file_with_a_long_name_{j:03d}.txt").write_text("")
    r = call(ToolContext(ws), "list_dir", target_directory="big")
    tree, note = r.text.split("\n\n")
    assert len(tree) <= LIST_MAX_CHARS and "too large" in note
    assert all(f"  - dir{i:02d}/" in tree for i in range(30))  # the top level is complete
    assert "file_with_a_long_name" not in tree


def test_list_dir_missing_and_file(ws):
    assert call(ToolContext(ws), "list_dir", target_directory="nope").is_error
    assert call(ToolContext(ws), "list_dir", target_directory="notes.md").is_error
