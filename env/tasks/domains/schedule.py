"""Domain: day calendars (bookings, free time, overlaps)."""

from env.tasks.domains.base import Domain, Fn, Scenario, pick

SCHEDULE = Domain(
    key="schedule",
    packages=("timetable", "planner", "rosterly", "daybook"),
    doc="Day calendars: bookings, free time, overlaps.",
    modules={0: ("clock", "times", "minutes"), 1: ("slots", "intervals", "spans"), 2: ("calendar", "agenda")},
    module_docs={
        0: "Clock times as minutes since midnight.",
        1: "Intervals of (start, end) minutes.",
        2: "The calendar type.",
    },
    names={
        "parse_time": ("parse_time", "to_minutes", "minutes_of"),
        "format_time": ("format_time", "to_clock", "clock_text"),
        "overlap": ("overlap", "shared_minutes", "intersection"),
        "duration": ("duration", "span_length", "minutes_between"),
        "gaps": ("gaps", "free_spans", "openings"),
        "total_overlap": ("total_overlap", "overlap_sum", "clash_minutes"),
        "merge": ("merge", "merge_spans", "union"),
        "Calendar": ("Calendar", "Agenda", "Day"),
        "book": ("book", "reserve", "schedule"),
        "free": ("free", "free_time", "open_slots"),
        "first_free": ("first_free", "next_opening", "earliest_slot"),
        "busy_minutes": ("busy_minutes", "booked_minutes", "busy_time"),
        "conflicts": ("conflicts", "clashes", "overlap_with"),
    },
    consts={"DAY_START": ('"08:00"', '"09:00"'), "DAY_END": ('"17:00"', '"18:00"')},
    functions=(
        Fn(
            "parse_time",
            0,
            '''
def ${parse_time}(text):
    """Minutes since midnight of an 'HH:MM' time."""
    hours, minutes = text.split(":")
    return int(hours) * 60 + int(minutes)
''',
        ),
        Fn(
            "format_time",
            0,
            '''
def ${format_time}(minutes):
    """'HH:MM' of a number of minutes since midnight."""
    hours = minutes // 60
    rest = minutes % 60
    return f"{hours:02d}:{rest:02d}"
''',
        ),
        Fn(
            "overlap",
            0,
            '''
def ${overlap}(start_a, end_a, start_b, end_b):
    """Minutes shared by [start_a, end_a) and [start_b, end_b)."""
    start = max(start_a, start_b)
    end = min(end_a, end_b)
    if end <= start:
        return 0
    return end - start
''',
        ),
        Fn(
            "duration",
            0,
            '''
def ${duration}(start, end):
    """Length of [start, end) in minutes."""
    if end < start:
        raise ValueError("an interval cannot end before it starts")
    return end - start
''',
        ),
        Fn(
            "merge",
            1,
            '''
def ${merge}(spans):
    """The union of (start, end) intervals as sorted, disjoint intervals."""
    merged = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
''',
        ),
        Fn(
            "gaps",
            1,
            '''
def ${gaps}(busy, day_start, day_end):
    """Free (start, end) intervals of [day_start, day_end) around the busy intervals."""
    free = []
    cursor = day_start
    for start, end in ${merge}(busy):
        if start > cursor:
            free.append((cursor, start))
        cursor = max(cursor, end)
    if cursor < day_end:
        free.append((cursor, day_end))
    return free
''',
        ),
        Fn(
            "total_overlap",
            1,
            '''
def ${total_overlap}(spans, start, end):
    """Minutes of the intervals that fall inside [start, end)."""
    shared = 0
    for span_start, span_end in spans:
        shared += ${overlap}(span_start, span_end, start, end)
    return shared
''',
        ),
        Fn(
            "Calendar",
            2,
            '''
class ${Calendar}:
    """One day of bookings between a start and an end time."""

    def __init__(self, start=${DAY_START}, end=${DAY_END}):
        self.start = ${parse_time}(start)
        self.end = ${parse_time}(end)
        self.bookings = []

    def ${book}(self, start, end):
        """Books [start, end) ('HH:MM' times); refuses overlaps with earlier bookings."""
        span = (${parse_time}(start), ${parse_time}(end))
        if ${total_overlap}(self.bookings, span[0], span[1]) > 0:
            raise ValueError(f"{start}-{end} overlaps a booking")
        self.bookings.append(span)

    def ${busy_minutes}(self):
        """Total booked minutes."""
        return sum(${duration}(s, e) for s, e in self.bookings)

    def ${free}(self):
        """Free intervals as 'HH:MM-HH:MM' strings."""
        spans = ${gaps}(self.bookings, self.start, self.end)
        return [f"{${format_time}(s)}-{${format_time}(e)}" for s, e in spans]

    def ${first_free}(self, minutes):
        """Start ('HH:MM') of the first free interval of at least `minutes`, or None."""
        for s, e in ${gaps}(self.bookings, self.start, self.end):
            if e - s >= minutes:
                return ${format_time}(s)
        return None

    def ${conflicts}(self, start, end):
        """Booked minutes inside [start, end)."""
        return ${total_overlap}(self.bookings, ${parse_time}(start), ${parse_time}(end))
''',
        ),
    ),
    scenarios=(
        Scenario(
            "${free}_around_bookings",
            "the free time around two bookings",
            (
                'day = ${Calendar}("09:00", "17:00")',
                'day.${book}("${h1}:00", "${h1}:${m1}")',
                'day.${book}("${h2}:15", "${h3}:00")',
            ),
            "day.${free}()",
            {"h1": pick(10, 11), "m1": pick(30, 45), "h2": pick(13, 14), "h3": pick(15, 16)},
        ),
        Scenario(
            "${busy_minutes}_total",
            "the booked minutes",
            (
                'day = ${Calendar}("08:00", "18:00")',
                'day.${book}("${h1}:00", "${h1}:${m1}")',
                'day.${book}("${h2}:30", "${h3}:15")',
            ),
            "day.${busy_minutes}()",
            {"h1": pick(9, 10), "m1": pick(20, 45), "h2": pick(12, 13), "h3": pick(14, 15)},
        ),
        Scenario(
            "${first_free}_long_enough",
            "the first opening long enough for a meeting",
            (
                'day = ${Calendar}("09:00", "17:00")',
                'day.${book}("09:${m0}", "10:00")',
                'day.${book}("10:${m1}", "12:00")',
            ),
            "day.${first_free}(${need})",
            {"m0": pick(20, 30), "m1": pick(15, 20), "need": pick(30, 45, 60)},
        ),
        Scenario(
            "${first_free}_none",
            "asking for an opening longer than any",
            ('day = ${Calendar}("09:00", "12:00")', 'day.${book}("09:30", "11:${m}")'),
            "day.${first_free}(${need})",
            {"m": pick(10, 15, 30), "need": pick(90, 120)},
        ),
        Scenario(
            "${conflicts}_with_window",
            "the booked minutes inside a time window",
            (
                "day = ${Calendar}()",
                'day.${book}("${h1}:00", "${h2}:30")',
                'day.${book}("${h3}:00", "${h4}:00")',
            ),
            'day.${conflicts}("${w1}:15", "${w2}:45")',
            {
                "h1": pick(9, 10),
                "h2": pick(11, 12),
                "h3": pick(13, 14),
                "h4": pick(15, 16),
                "w1": pick(10, 11),
                "w2": pick(13, 14),
            },
        ),
        Scenario(
            "${book}_adjacent",
            "booking right after another booking",
            ("day = ${Calendar}()", 'day.${book}("10:00", "${h}:00")', 'day.${book}("${h}:00", "${h2}:30")'),
            "day.${busy_minutes}()",
            {"h": pick(11, 12), "h2": pick(13, 14)},
        ),
        Scenario(
            "${book}_overlap_rejected",
            "booking over an existing booking",
            ("day = ${Calendar}()", 'day.${book}("10:00", "${h}:00")'),
            'day.${book}("${h2}:30", "${h3}:00")',
            {"h": pick(12, 13), "h2": pick(10, 11), "h3": pick(14, 15)},
            raises="ValueError",
        ),
    ),
)
