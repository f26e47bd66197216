"""Domain: personal account books (deposits, withdrawals with fees, interest)."""

from env.tasks.domains.base import PEOPLE, Domain, Fn, Scenario, ints, money, pick

LEDGER = Domain(
    key="ledger",
    packages=("bankbook", "ledgerly", "tallybook", "coinvault"),
    doc="Personal account books: deposits, withdrawals with fees, interest.",
    modules={0: ("money", "amounts", "cents"), 1: ("fees", "charges", "tariffs"), 2: ("accounts", "books")},
    module_docs={
        0: "Money arithmetic: rounding, percentages, limits.",
        1: "Fees, interest and totals.",
        2: "The account type.",
    },
    names={
        "round_to": ("round_to", "round_places", "to_places"),
        "round_cents": ("round_cents", "to_cents", "money_round"),
        "percent_of": ("percent_of", "portion", "pct_amount"),
        "clamp": ("clamp", "bounded", "limit_to"),
        "sum_kind": ("sum_kind", "kind_total", "total_of_kind"),
        "split_evenly": ("split_evenly", "share_out", "divide_amount"),
        "withdrawal_fee": ("withdrawal_fee", "fee_for", "charge_for"),
        "compound": ("compound", "grow_balance", "accrue"),
        "net_total": ("net_total", "sum_entries", "net_amount"),
        "format_amount": ("format_amount", "show_amount", "as_text"),
        "Ledger": ("Ledger", "Account", "Wallet"),
        "deposit": ("deposit", "pay_in", "credit"),
        "withdraw": ("withdraw", "pay_out", "debit"),
        "balance": ("balance", "current_balance", "funds"),
        "projected": ("projected", "forecast", "balance_in"),
        "split": ("split", "split_between", "divide"),
    },
    consts={"FEE_PCT": (1, 2, 3), "MIN_FEE": (1, 2), "MAX_FEE": (10, 15, 25)},
    functions=(
        Fn(
            "round_to",
            0,
            '''
def ${round_to}(value, places):
    """`value` rounded to `places` decimal places."""
    factor = 10**places
    return round(value * factor) / factor
''',
        ),
        Fn(
            "round_cents",
            0,
            '''
def ${round_cents}(amount):
    """A money amount rounded to whole cents."""
    return ${round_to}(amount, 2)
''',
        ),
        Fn(
            "percent_of",
            0,
            '''
def ${percent_of}(amount, percent):
    """`percent` percent of `amount`, rounded to cents."""
    share = amount * percent / 100
    return ${round_to}(share, 2)
''',
        ),
        Fn(
            "clamp",
            0,
            '''
def ${clamp}(value, low, high):
    """`value` limited to the closed range [low, high]."""
    if value < low:
        return low
    if value > high:
        return high
    return value
''',
        ),
        Fn(
            "sum_kind",
            0,
            '''
def ${sum_kind}(entries, kind):
    """Total amount of the (kind, amount) entries of one kind."""
    total = 0
    for entry_kind, amount in entries:
        if entry_kind == kind:
            total += amount
    return total
''',
        ),
        Fn(
            "format_amount",
            0,
            '''
def ${format_amount}(amount, currency="EUR"):
    """An amount as text, e.g. '12.50 EUR'."""
    return f"{amount:.2f} {currency}"
''',
        ),
        Fn(
            "split_evenly",
            1,
            '''
def ${split_evenly}(amount, parts):
    """`amount` split into `parts` shares of whole cents; the first shares take the remainder."""
    cents = round(amount * 100)
    base = cents // parts
    extra = cents - base * parts
    shares = []
    for index in range(parts):
        share = base + 1 if index < extra else base
        shares.append(share / 100)
    return shares
''',
        ),
        Fn(
            "withdrawal_fee",
            1,
            '''
def ${withdrawal_fee}(amount):
    """Fee for a withdrawal: ${FEE_PCT} percent of it, at least ${MIN_FEE} and at most ${MAX_FEE}."""
    fee = ${percent_of}(amount, ${FEE_PCT})
    return ${clamp}(fee, ${MIN_FEE}, ${MAX_FEE})
''',
        ),
        Fn(
            "compound",
            1,
            '''
def ${compound}(balance, rate, months):
    """`balance` after `months` of monthly compounding at a yearly `rate` percent."""
    result = balance
    for _ in range(months):
        result = result + ${percent_of}(result, rate / 12)
    return result
''',
        ),
        Fn(
            "net_total",
            1,
            '''
def ${net_total}(entries):
    """Deposits minus withdrawals over (kind, amount) entries, in cents."""
    deposits = ${sum_kind}(entries, "in")
    withdrawals = ${sum_kind}(entries, "out")
    return ${round_cents}(deposits - withdrawals)
''',
        ),
        Fn(
            "Ledger",
            2,
            '''
class ${Ledger}:
    """An account: a history of ("in" | "out", amount) entries."""

    def __init__(self, owner, opening=0):
        self.owner = owner
        self.entries = []
        if opening > 0:
            self.entries.append(("in", opening))

    def ${deposit}(self, amount):
        """Adds a deposit; the amount must be positive."""
        if amount <= 0:
            raise ValueError("a deposit must be positive")
        self.entries.append(("in", ${round_cents}(amount)))

    def ${withdraw}(self, amount):
        """Takes out `amount` plus the fee and returns the fee."""
        fee = ${withdrawal_fee}(amount)
        cost = amount + fee
        if cost > self.${balance}():
            raise ValueError("insufficient funds")
        self.entries.append(("out", cost))
        return fee

    def ${balance}(self):
        """The current balance."""
        return ${net_total}(self.entries)

    def ${projected}(self, rate, months):
        """The balance after `months` of interest at a yearly `rate` percent."""
        return ${round_cents}(${compound}(self.${balance}(), rate, months))

    def ${split}(self, parts):
        """The current balance split into `parts` shares."""
        if parts < 1:
            raise ValueError("need at least one part")
        return ${split_evenly}(self.${balance}(), parts)
''',
        ),
    ),
    scenarios=(
        Scenario(
            "${balance}_after_deposits",
            "the balance after two deposits",
            ("acct = ${Ledger}(${who}, ${a})", "acct.${deposit}(${b})", "acct.${deposit}(${c})"),
            "acct.${balance}()",
            {"who": pick(*PEOPLE), "a": money(10, 300), "b": money(1, 99), "c": money(1, 99)},
        ),
        Scenario(
            "${withdraw}_fee",
            "the fee returned by a withdrawal",
            ("acct = ${Ledger}(${who}, 2000)",),
            "acct.${withdraw}(${a})",
            {"who": pick(*PEOPLE), "a": ints(120, 700)},
        ),
        Scenario(
            "small_${withdraw}_fee",
            "the fee of a small withdrawal",
            ("acct = ${Ledger}(${who}, 500)",),
            "acct.${withdraw}(${a})",
            {"who": pick(*PEOPLE), "a": ints(5, 30)},
        ),
        Scenario(
            "large_${withdraw}_fee",
            "the fee of a large withdrawal",
            ("acct = ${Ledger}(${who}, 5000)",),
            "acct.${withdraw}(${a})",
            {"who": pick(*PEOPLE), "a": ints(1500, 3000)},
        ),
        Scenario(
            "${balance}_after_${withdraw}",
            "the balance after a withdrawal",
            ("acct = ${Ledger}(${who}, ${a})", "acct.${withdraw}(${b})"),
            "acct.${balance}()",
            {"who": pick(*PEOPLE), "a": money(300, 900), "b": ints(40, 250)},
        ),
        Scenario(
            "${projected}_balance",
            "the projected balance with interest",
            ("acct = ${Ledger}(${who}, ${a})",),
            "acct.${projected}(${rate}, ${months})",
            {"who": pick(*PEOPLE), "a": ints(100, 2000), "rate": pick(2, 3, 4, 6), "months": ints(2, 9)},
        ),
        Scenario(
            "${split}_shares",
            "the shares of a split balance",
            ("acct = ${Ledger}(${who}, ${a})",),
            "acct.${split}(${n})",
            {"who": pick(*PEOPLE), "a": pick(10.0, 100.0, 25.0, 7.0, 50.0), "n": pick(3, 6, 7)},
        ),
        Scenario(
            "${withdraw}_more_than_balance",
            "a withdrawal larger than the balance",
            ("acct = ${Ledger}(${who}, ${a})",),
            "acct.${withdraw}(${b})",
            {"who": pick(*PEOPLE), "a": ints(10, 50), "b": ints(60, 200)},
            raises="ValueError",
        ),
        Scenario(
            "${deposit}_rejects_zero",
            "a deposit of zero",
            ("acct = ${Ledger}(${who})",),
            "acct.${deposit}(0)",
            {"who": pick(*PEOPLE)},
            raises="ValueError",
        ),
    ),
)
