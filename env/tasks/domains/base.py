"""What domain templates are made of: functions (`Fn`), tests (`Scenario`), domains, value generators."""

import dataclasses
import random
from collections.abc import Callable

Value = Callable[[random.Random], object]


@dataclasses.dataclass(frozen=True)
class Fn:
    """One function or class template, in call layer `layer` (0 leaf, 1 helper, 2 entry point)."""

    role: str
    layer: int
    src: str


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One test: setup lines, then an expression compared with its correct value (or, with `raises`, a
    statement that must raise that exception). `about` names what a user sees go wrong, for bug reports."""

    name: str
    about: str
    setup: tuple[str, ...]
    expr: str
    values: dict[str, Value] = dataclasses.field(default_factory=dict)
    raises: str | None = None


@dataclasses.dataclass(frozen=True)
class Domain:
    key: str
    packages: tuple[str, ...]  # package names (main domains) ...
    doc: str  # ... and the package docstring
    modules: dict[int, tuple[str, ...]]  # layer -> module name choices
    module_docs: dict[int, str]
    names: dict[str, tuple[str, ...]]  # role -> name choices
    functions: tuple[Fn, ...]
    scenarios: tuple[Scenario, ...]
    consts: dict[str, tuple] = dataclasses.field(default_factory=dict)


def ints(lo: int, hi: int) -> Value:
    return lambda r: r.randint(lo, hi)


def money(lo: int, hi: int) -> Value:
    """An amount with cents, e.g. 37.25 (quarters, so sums stay exact in binary)."""
    return lambda r: r.randint(lo * 4, hi * 4) / 4


def pick(*options) -> Value:
    return lambda r: r.choice(options)


@dataclasses.dataclass(frozen=True)
class Derived:
    """A scenario value computed from the values drawn before it (a dict of them)."""

    fn: Callable[[dict], object]


PEOPLE = (
    "ana",
    "bo",
    "chen",
    "dara",
    "eli",
    "fay",
    "gus",
    "ines",
    "jo",
    "kai",
    "lena",
    "milo",
    "nora",
    "omar",
)
ITEMS = (
    "bolt",
    "nut",
    "washer",
    "hinge",
    "screw",
    "bracket",
    "gasket",
    "spring",
    "rivet",
    "valve",
    "clamp_pad",
)
WORDS = [
    "river",
    "stone",
    "light",
    "garden",
    "market",
    "winter",
    "paper",
    "orange",
    "silver",
    "engine",
    "window",
    "forest",
    "yellow",
    "number",
    "simple",
    "water",
    "table",
    "quiet",
    "rapid",
    "green",
    "ocean",
    "letter",
    "music",
    "basket",
    "candle",
    "pepper",
]
