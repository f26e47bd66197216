"""pytest's per-test outcomes, read from what a test run leaves: its junit XML report or its `-rA` short
test summary. Outcomes are those of env.reward.OUTCOMES; a test a report does not name is 'missing'."""

import os
import re
import stat
import xml.etree.ElementTree as ET
from pathlib import Path

MAX_REPORT_BYTES = 8 << 20


def read_report(path: Path) -> bytes | None:
    """The bytes of a report file the test run wrote, or None if it is not a regular file (a link, a pipe:
    the run is hostile), is missing or is larger than MAX_REPORT_BYTES."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_REPORT_BYTES:
            return None
        return f.read(MAX_REPORT_BYTES + 1)


_RANK = {o: i for i, o in enumerate(("missing", "passed", "skipped", "failed", "error"))}


def _worse(tests: dict[str, str], node: str, outcome: str) -> None:
    """Records `outcome` for `node` unless a worse one is known: a test reported twice (its call passed, its
    teardown errored) counts as its worse report."""
    if _RANK[outcome] > _RANK[tests[node]]:
        tests[node] = outcome


def parse_junit(data: bytes, nodes: list[str]) -> dict[str, str] | None:
    """Outcomes of `nodes` from a junit XML report; None if it is not XML."""
    try:
        root = ET.fromstring(data)
    except ET.ParseError:
        return None
    tests = {t: "missing" for t in nodes}
    keys = {_junit_key(t): t for t in nodes}
    for case in root.iter("testcase"):
        node = keys.get((case.get("classname", ""), case.get("name", "")))
        if node is None:
            continue
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                break
        _worse(tests, node, outcome)
    return tests


# pytest's short test summary words (-rA) and the outcome each stands for; an xfail counts as skipped and an
# xpass as passed, as in the junit report.
SUMMARY_WORDS = {
    "PASSED": "passed",
    "FAILED": "failed",
    "ERROR": "error",
    "SKIPPED": "skipped",
    "XFAIL": "skipped",
    "XPASS": "passed",
}
_SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+$", re.MULTILINE)


def parse_summary(output: str, nodes: list[str]) -> dict[str, str]:
    """Outcomes of `nodes` from pytest's `-rA` short test summary in `output`: lines `PASSED node`,
    `FAILED node - message`, `ERROR node`. Only lines after the last summary header count (what the tests
    print before it cannot pose as a result)."""
    tests = {t: "missing" for t in nodes}
    headers = list(_SUMMARY_HEADER.finditer(output))
    if not headers:
        return tests
    for line in output[headers[-1].end() :].splitlines():
        word, _, rest = line.partition(" ")
        outcome = SUMMARY_WORDS.get(word)
        if outcome is None:
            continue
        # The node id ends the line or is followed by " - message"; a parametrized id may itself hold " - ".
        if rest in tests:
            _worse(tests, rest, outcome)
            continue
        for i in reversed([m.start() for m in re.finditer(" - ", rest)]):
            if rest[:i] in tests:
                _worse(tests, rest[:i], outcome)
                break
    return tests


def _junit_key(node_id: str) -> tuple[str, str]:
    """(classname, name) that pytest's junit report gives node `node_id`: the path as a dotted module
    (`pkg/tests/test_x.py` -> `pkg.tests.test_x`), then the classes, '.'-joined; the name is the last part,
    with its parameters (split off first, as pytest does, since they may hold '::', '/' or '.py')."""
    address, bracket, params = node_id.partition("[")
    path, *parts = address.split("::")
    module = path.replace("/", ".")
    module = module[:-3] if module.endswith(".py") else module
    names = [module, *parts]
    names[-1] += bracket + params
    return ".".join(names[:-1]), names[-1]
