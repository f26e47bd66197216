"""Side domains: one-module libraries added as distractor code (their tests pass before and after)."""

from env.tasks.domains.base import PEOPLE, WORDS, Domain, Fn, Scenario, ints, pick

STATS = Domain(
    key="stats",
    packages=(),
    doc="",
    modules={2: ("stats", "summary", "numbers")},
    module_docs={2: "Small statistics over lists of numbers."},
    names={
        "mean": ("mean", "average"),
        "median": ("median", "middle_value"),
        "spread": ("spread", "value_range"),
        "running_max": ("running_max", "peaks"),
    },
    functions=(
        Fn(
            "mean",
            2,
            '''
def ${mean}(values):
    """Arithmetic mean, to 3 places."""
    return round(sum(values) / len(values), 3)
''',
        ),
        Fn(
            "median",
            2,
            '''
def ${median}(values):
    """Middle value (mean of the two middle values for an even count)."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2 == 1:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2
''',
        ),
        Fn(
            "spread",
            2,
            '''
def ${spread}(values):
    """Largest minus smallest value."""
    return max(values) - min(values)
''',
        ),
        Fn(
            "running_max",
            2,
            '''
def ${running_max}(values):
    """The largest value seen so far, at each position."""
    out = []
    best = None
    for v in values:
        if best is None or v > best:
            best = v
        out.append(best)
    return out
''',
        ),
    ),
    scenarios=(
        Scenario(
            "${mean}_of_values",
            "the mean",
            (),
            "${mean}(${xs})",
            {"xs": lambda r: [r.randint(1, 50) for _ in range(r.randint(3, 6))]},
        ),
        Scenario(
            "${median}_odd",
            "the median of an odd count",
            (),
            "${median}(${xs})",
            {"xs": lambda r: [r.randint(1, 50) for _ in range(5)]},
        ),
        Scenario(
            "${median}_even",
            "the median of an even count",
            (),
            "${median}(${xs})",
            {"xs": lambda r: [r.randint(1, 50) for _ in range(4)]},
        ),
        Scenario(
            "${spread}_of_values",
            "the spread",
            (),
            "${spread}(${xs})",
            {"xs": lambda r: [r.randint(-20, 50) for _ in range(5)]},
        ),
        Scenario(
            "${running_max}_steps",
            "the running maximum",
            (),
            "${running_max}(${xs})",
            {"xs": lambda r: [r.randint(0, 9) for _ in range(6)]},
        ),
    ),
)

SLUGS = Domain(
    key="slugs",
    packages=(),
    doc="",
    modules={2: ("slugs", "naming", "labels")},
    module_docs={2: "Names turned into identifiers and labels."},
    names={
        "slugify": ("slugify", "to_slug", "url_name"),
        "initials": ("initials", "monogram"),
        "pad_label": ("pad_label", "fit_label", "fixed_width"),
    },
    functions=(
        Fn(
            "slugify",
            2,
            '''
def ${slugify}(text, sep="-"):
    """Lower-case words of letters and digits joined by `sep`."""
    parts = []
    current = ""
    for ch in text.lower():
        if ch.isalnum():
            current += ch
        elif current:
            parts.append(current)
            current = ""
    if current:
        parts.append(current)
    return sep.join(parts)
''',
        ),
        Fn(
            "initials",
            2,
            '''
def ${initials}(name):
    """Upper-case first letters of the words of `name`."""
    return "".join(word[0].upper() for word in name.split())
''',
        ),
        Fn(
            "pad_label",
            2,
            '''
def ${pad_label}(label, width, fill="."):
    """`label` padded on the right with `fill` to `width` characters, or cut to `width`."""
    if len(label) >= width:
        return label[:width]
    return label + fill * (width - len(label))
''',
        ),
    ),
    scenarios=(
        Scenario(
            "${slugify}_title",
            "a slug",
            (),
            "${slugify}(${t})",
            {"t": lambda r: f"{r.choice(WORDS).title()}, {r.choice(WORDS)} & {r.choice(WORDS)}!"},
        ),
        Scenario(
            "${initials}_of_name",
            "initials",
            (),
            "${initials}(${n})",
            {"n": lambda r: " ".join(r.sample(PEOPLE, 2))},
        ),
        Scenario(
            "${pad_label}_short",
            "a padded label",
            (),
            "${pad_label}(${t}, ${w})",
            {"t": pick(*WORDS), "w": ints(10, 14)},
        ),
        Scenario(
            "${pad_label}_long",
            "a cut label",
            (),
            "${pad_label}(${t}, ${w})",
            {"t": pick(*[w for w in WORDS if len(w) >= 6]), "w": ints(2, 4)},
        ),
    ),
)

UNITS = Domain(
    key="units",
    packages=(),
    doc="",
    modules={2: ("units", "convert", "conversions")},
    module_docs={2: "Unit conversions."},
    names={
        "c_to_f": ("c_to_f", "celsius_to_fahrenheit"),
        "km_to_miles": ("km_to_miles", "to_miles"),
        "pace": ("pace", "minutes_per_km"),
    },
    functions=(
        Fn(
            "c_to_f",
            2,
            '''
def ${c_to_f}(celsius):
    """Degrees Fahrenheit, to 1 place."""
    return round(celsius * 9 / 5 + 32, 1)
''',
        ),
        Fn(
            "km_to_miles",
            2,
            '''
def ${km_to_miles}(km):
    """Miles, to 2 places."""
    return round(km * 0.621371, 2)
''',
        ),
        Fn(
            "pace",
            2,
            '''
def ${pace}(km, minutes):
    """Running pace as 'M:SS' per kilometre."""
    seconds = round(minutes * 60 / km)
    return f"{seconds // 60}:{seconds % 60:02d}"
''',
        ),
    ),
    scenarios=(
        Scenario("${c_to_f}_values", "a temperature conversion", (), "${c_to_f}(${c})", {"c": ints(-30, 40)}),
        Scenario(
            "${km_to_miles}_distance", "a distance conversion", (), "${km_to_miles}(${k})", {"k": ints(1, 50)}
        ),
        Scenario(
            "${pace}_per_km",
            "a running pace",
            (),
            "${pace}(${k}, ${m})",
            {"k": pick(5, 10, 21), "m": ints(25, 130)},
        ),
    ),
)

SEQS = Domain(
    key="seqs",
    packages=(),
    doc="",
    modules={2: ("seqs", "listops", "batching")},
    module_docs={2: "List helpers."},
    names={
        "chunked": ("chunked", "batches", "in_groups"),
        "dedupe": ("dedupe", "unique", "distinct"),
        "interleave": ("interleave", "zip_merge", "alternate"),
    },
    functions=(
        Fn(
            "chunked",
            2,
            '''
def ${chunked}(items, size):
    """`items` in consecutive lists of `size` (the last may be shorter)."""
    groups = []
    for start in range(0, len(items), size):
        groups.append(items[start : start + size])
    return groups
''',
        ),
        Fn(
            "dedupe",
            2,
            '''
def ${dedupe}(items):
    """`items` without repeats, first occurrences kept in order."""
    seen = set()
    kept = []
    for item in items:
        if item not in seen:
            seen.add(item)
            kept.append(item)
    return kept
''',
        ),
        Fn(
            "interleave",
            2,
            '''
def ${interleave}(first, second):
    """Items taken alternately from both lists; the rest of the longer one at the end."""
    out = []
    for i in range(max(len(first), len(second))):
        if i < len(first):
            out.append(first[i])
        if i < len(second):
            out.append(second[i])
    return out
''',
        ),
    ),
    scenarios=(
        Scenario(
            "${chunked}_groups",
            "chunking a list",
            (),
            "${chunked}(${xs}, ${n})",
            {"xs": lambda r: list(range(r.randint(5, 11))), "n": pick(2, 3, 4)},
        ),
        Scenario(
            "${dedupe}_keeps_order",
            "removing repeats",
            (),
            "${dedupe}(${xs})",
            {"xs": lambda r: [r.choice("abcde") for _ in range(8)]},
        ),
        Scenario(
            "${interleave}_lists",
            "interleaving two lists",
            (),
            "${interleave}(${a}, ${b})",
            {"a": lambda r: list(range(r.randint(1, 4))), "b": lambda r: list("xyz"[: r.randint(1, 3)])},
        ),
    ),
)
