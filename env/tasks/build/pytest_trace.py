"""A pytest plugin the builder loads into a project's test run; it imports nothing of this project.

The builder copies this file into the sandbox's /tmp and runs `python -m pytest -p composer_build_trace ...`
with that directory on PYTHONPATH. At the end of the session it writes one JSON file ($COMPOSER_TRACE_OUT):

    root                 pytest's rootdir (node ids are relative to it)
    tests                node id -> passed | failed | error | skipped | xfail
    failures             node id -> {"exc", "message", "test_line", "test_lineno"} of each failing test
    collection_errors    [{"nodeid", "message"}]: files or modules that could not be collected
    calls                node id -> ["path/of/file.py::Qual.name", ...] (only with COMPOSER_TRACE=1): the
                         functions under the rootdir that ran during the test's setup, call and teardown

With $COMPOSER_TRACE_EXIT_S set, a process still alive that many seconds after pytest is done (a thread left
running by a test keeps the interpreter from exiting) writes "<report>.hung" and exits, so the caller learns
that the test command does not end by itself without waiting for its own timeout.

Tracing uses sys.settrace with 'call' events only (the trace function returns None, so no line events), and
decides once per code object whether it belongs to the project.
"""

import json
import os
import sys
import threading
import time

import pytest

_OUT = os.environ.get("COMPOSER_TRACE_OUT")
_EXIT_S = os.environ.get("COMPOSER_TRACE_EXIT_S")
_TRACE = os.environ.get("COMPOSER_TRACE") == "1"
_RANK = {"passed": 0, "xfail": 1, "skipped": 2, "failed": 3, "error": 4}
_MESSAGE_CHARS = 2000

_state = {"root": None, "tests": {}, "failures": {}, "collection_errors": [], "calls": {}}
_keys: dict = {}
_current: set = set()


def _key(code):
    filename = code.co_filename
    root = _state["root"]
    if not filename.startswith(root + os.sep):
        return None
    name = getattr(code, "co_qualname", code.co_name)
    if "<" in name:  # module bodies, lambdas, comprehensions, nested functions
        return None
    return os.path.relpath(filename, root).replace(os.sep, "/") + "::" + name


def _tracer(frame, event, arg):
    if event == "call":
        code = frame.f_code
        key = _keys.get(code, 0)
        if key == 0:
            key = _keys[code] = _key(code)
        if key is not None:
            _current.add(key)
    return None


def pytest_configure(config):
    _state["root"] = str(config.rootpath)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current.clear()
    if _TRACE:
        threading.settrace(_tracer)
        sys.settrace(_tracer)
    try:
        yield
    finally:
        if _TRACE:
            sys.settrace(None)
            threading.settrace(None)
            _state["calls"][item.nodeid] = sorted(_current)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None and item.nodeid not in _state["failures"]:
        _state["failures"][item.nodeid] = _failure(item, call.excinfo)


def _failure(item, excinfo) -> dict:
    line, lineno = "", None
    for entry in reversed(excinfo.traceback):
        if str(entry.path) == str(item.path):
            lineno = entry.lineno + 1
            try:
                line = str(entry.statement).strip()
            except Exception:
                line = ""
            break
    try:
        message = str(excinfo.value)
    except Exception:
        message = ""
    return {
        "exc": excinfo.type.__name__,
        "message": message[:_MESSAGE_CHARS],
        "test_line": line[:_MESSAGE_CHARS],
        "test_lineno": lineno,
    }


def pytest_runtest_logreport(report):
    if hasattr(report, "wasxfail"):
        outcome = "xfail"
    elif report.failed:
        outcome = "failed" if report.when == "call" else "error"
    elif report.skipped:
        outcome = "skipped"
    elif report.when == "call":
        outcome = "passed"
    else:
        return
    tests = _state["tests"]
    old = tests.get(report.nodeid)
    if old is None or _RANK[outcome] > _RANK[old]:
        tests[report.nodeid] = outcome


def pytest_collectreport(report):
    if report.failed:
        text = str(report.longrepr)
        _state["collection_errors"].append({"nodeid": report.nodeid, "message": text[-_MESSAGE_CHARS:]})


def pytest_sessionfinish(session, exitstatus):
    _state["exitstatus"] = int(exitstatus)
    if _OUT:
        with open(_OUT, "w") as f:
            json.dump(_state, f)


def pytest_unconfigure(config):
    if _OUT and _EXIT_S:
        threading.Thread(target=_watchdog, args=(float(_EXIT_S),), daemon=True).start()


def _watchdog(seconds):
    time.sleep(seconds)
    with open(_OUT + ".hung", "w") as f:
        f.write("the process did not exit after the tests ran\n")
    os._exit(_state.get("exitstatus", 1))
