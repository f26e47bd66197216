"""The building blocks of generated repositories: domains of functions and the tests that call them.

A `Domain` is a small library written as templates: functions in call layers (0: leaves, 1: helpers that call
leaves, 2: the public entry points, a class or functions, that the tests call), the tests ("scenarios"), and
word lists for every name. `${role}` in a template is the name chosen for that role, `${CONST}` a constant
chosen from `consts`; in a scenario `${x}` is also a value drawn by `values[x]` (inserted as a literal).
The generator lays the layers out as modules (the deeper the difficulty, the more modules between the test and
the bug) and adds small unrelated domains (`SIDE_DOMAINS`: one module each) as distractors.

Templates avoid `while` loops and recursion, so no injected bug can hang a test.
"""

from env.tasks.domains.base import Derived, Domain, Fn, Scenario
from env.tasks.domains.geometry import GEOMETRY
from env.tasks.domains.inventory import INVENTORY
from env.tasks.domains.ledger import LEDGER
from env.tasks.domains.schedule import SCHEDULE
from env.tasks.domains.side import SEQS, SLUGS, STATS, UNITS
from env.tasks.domains.text import TEXT

DOMAINS: tuple[Domain, ...] = (LEDGER, INVENTORY, GEOMETRY, TEXT, SCHEDULE)
SIDE_DOMAINS: tuple[Domain, ...] = (STATS, SLUGS, UNITS, SEQS)

__all__ = ["DOMAINS", "SIDE_DOMAINS", "Derived", "Domain", "Fn", "Scenario"]
