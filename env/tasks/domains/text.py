"""Domain: plain-text analysis (words, keywords, readability, summaries)."""

import random

from env.tasks.domains.base import WORDS, Domain, Fn, Scenario, ints, pick

TEXT = Domain(
    key="text",
    packages=("wordsmith", "textkit", "scribe", "proseutil"),
    doc="Plain-text analysis: words, keywords, readability, summaries.",
    modules={
        0: ("tokens", "words", "chars"),
        1: ("analysis", "counting", "scoring"),
        2: ("documents", "report"),
    },
    module_docs={0: "Words and characters.", 1: "Counts and scores over a text.", 2: "The document type."},
    names={
        "tokenize": ("tokenize", "split_words", "words_of"),
        "is_vowel": ("is_vowel", "vowel", "vowelish"),
        "syllables": ("syllables", "syllable_count", "count_syllables"),
        "truncate": ("truncate", "shorten", "clip_text"),
        "capitalize": ("capitalize", "cap_word", "upper_first"),
        "word_counts": ("word_counts", "frequencies", "tally_words"),
        "top_words": ("top_words", "most_common", "frequent_words"),
        "sentence_count": ("sentence_count", "count_sentences", "sentences_in"),
        "avg_word_length": ("avg_word_length", "mean_word_length", "word_length"),
        "title_case": ("title_case", "titled", "headline_case"),
        "Document": ("Document", "Article", "Note"),
        "summary": ("summary", "teaser", "preview"),
        "keywords": ("keywords", "key_terms", "topics"),
        "sentences": ("sentences", "n_sentences"),
        "heading": ("heading", "display_title"),
        "word_stats": ("word_stats", "stats", "profile"),
    },
    consts={"SHORT": (3, 4)},
    functions=(
        Fn(
            "tokenize",
            0,
            '''
def ${tokenize}(text):
    """The lower-case words of `text`, without surrounding punctuation."""
    found = []
    for raw in text.split():
        word = raw.strip(".,;:!?()").lower()
        if word:
            found.append(word)
    return found
''',
        ),
        Fn(
            "is_vowel",
            0,
            '''
def ${is_vowel}(ch):
    """Whether `ch` is a vowel."""
    return ch.lower() in "aeiouy"
''',
        ),
        Fn(
            "syllables",
            0,
            '''
def ${syllables}(word):
    """Rough syllable count: groups of consecutive vowels, at least 1."""
    groups = 0
    previous = False
    for ch in word:
        current = ${is_vowel}(ch)
        if current and not previous:
            groups += 1
        previous = current
    return max(groups, 1)
''',
        ),
        Fn(
            "truncate",
            0,
            '''
def ${truncate}(text, width):
    """`text` cut to at most `width` characters, ending in '...' when cut."""
    if len(text) <= width:
        return text
    return text[: width - 3] + "..."
''',
        ),
        Fn(
            "capitalize",
            0,
            '''
def ${capitalize}(word, small):
    """`word` with a capital first letter unless it is in `small`."""
    if word in small:
        return word
    return word[:1].upper() + word[1:]
''',
        ),
        Fn(
            "word_counts",
            1,
            '''
def ${word_counts}(text):
    """How often each word occurs."""
    counts = {}
    for word in ${tokenize}(text):
        counts[word] = counts.get(word, 0) + 1
    return counts
''',
        ),
        Fn(
            "top_words",
            1,
            '''
def ${top_words}(text, n, min_length):
    """The `n` most frequent words of at least `min_length` letters (ties: alphabetical)."""
    counts = ${word_counts}(text)
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    chosen = []
    for word, _ in ranked:
        if len(word) >= min_length:
            chosen.append(word)
    return chosen[:n]
''',
        ),
        Fn(
            "sentence_count",
            1,
            '''
def ${sentence_count}(text):
    """Number of sentences: runs of text ended by '.', '!' or '?'."""
    ends = 0
    previous = ""
    for ch in text:
        if ch in ".!?" and previous not in ".!?":
            ends += 1
        previous = ch
    return max(ends, 1)
''',
        ),
        Fn(
            "avg_word_length",
            1,
            '''
def ${avg_word_length}(text):
    """Mean number of letters per word, to 2 places."""
    words = ${tokenize}(text)
    letters = 0
    for word in words:
        letters += len(word)
    return round(letters / len(words), 2)
''',
        ),
        Fn(
            "title_case",
            1,
            '''
def ${title_case}(text):
    """Title case: every word capitalised except short joining words after the first."""
    small = ("a", "an", "and", "of", "the", "in", "on", "to")
    words = text.lower().split()
    out = [${capitalize}(words[0], ())]
    for word in words[1:]:
        out.append(${capitalize}(word, small))
    return " ".join(out)
''',
        ),
        Fn(
            "Document",
            2,
            '''
class ${Document}:
    """A titled text."""

    def __init__(self, title, body):
        self.title = title
        self.body = body

    def ${summary}(self, width):
        """The first `width` characters of the body."""
        return ${truncate}(self.body, width)

    def ${keywords}(self, n):
        """The `n` most frequent words longer than ${SHORT} letters."""
        return ${top_words}(self.body, n, ${SHORT} + 1)

    def ${sentences}(self):
        """Number of sentences in the body."""
        return ${sentence_count}(self.body)

    def ${heading}(self):
        """The title in title case."""
        return ${title_case}(self.title)

    def ${word_stats}(self):
        """(words, syllables, mean word length) of the body."""
        words = ${tokenize}(self.body)
        total = 0
        for word in words:
            total += ${syllables}(word)
        return (len(words), total, ${avg_word_length}(self.body))
''',
        ),
    ),
    scenarios=(
        Scenario(
            "long_${summary}",
            "the summary of a long text",
            ("doc = ${Document}(${t}, ${body})",),
            "doc.${summary}(${w})",
            {"t": pick("notes", "draft"), "body": lambda r: _sentences(r, 3), "w": ints(12, 24)},
        ),
        Scenario(
            "short_${summary}",
            "the summary of a short text",
            ("doc = ${Document}(${t}, ${body})",),
            "doc.${summary}(40)",
            {"t": pick("memo", "note"), "body": lambda r: " ".join(r.sample(WORDS, 3)).capitalize() + "."},
        ),
        Scenario(
            "${keywords}_by_frequency",
            "the keywords of a text",
            ("doc = ${Document}(${t}, ${body})",),
            "doc.${keywords}(${n})",
            {"t": pick("log", "story"), "body": lambda r: _repetitive(r), "n": pick(2, 3)},
        ),
        Scenario(
            "${sentences}_counted",
            "the sentence count",
            ("doc = ${Document}(${t}, ${body})",),
            "doc.${sentences}()",
            {"t": pick("essay", "letter"), "body": lambda r: _sentences(r, r.randint(2, 4))},
        ),
        Scenario(
            "${heading}_title_case",
            "the heading of a document",
            ("doc = ${Document}(${t}, ${body})",),
            "doc.${heading}()",
            {
                "t": lambda r: f"{r.choice(WORDS)} of the {r.choice(WORDS)} and {r.choice(WORDS)}",
                "body": pick("", "x"),
            },
        ),
        Scenario(
            "${word_stats}_of_body",
            "the word statistics of a text",
            ("doc = ${Document}(${t}, ${body})",),
            "doc.${word_stats}()",
            {"t": pick("page", "entry"), "body": lambda r: _sentences(r, 2)},
        ),
    ),
)


def _sentences(r: random.Random, n: int) -> str:
    out = []
    for _ in range(n):
        words = r.sample(WORDS, r.randint(3, 6))
        out.append(" ".join(words).capitalize() + r.choice(".!?"))
    return " ".join(out)


def _repetitive(r: random.Random) -> str:
    """A text whose word frequencies differ (so the ranking is not all ties)."""
    chosen = r.sample(WORDS, 5)
    words = []
    for i, w in enumerate(chosen):
        words += [w] * (5 - i)
    words += ["a", "an", "of", "to"]
    r.shuffle(words)
    return " ".join(words).capitalize() + "."
