"""Domain: a small warehouse (stock levels, reorder rules, purchase quotes)."""

from env.tasks.domains.base import ITEMS, Domain, Fn, Scenario, ints, money, pick

INVENTORY = Domain(
    key="inventory",
    packages=("stockroom", "shelfkit", "depotline", "binkeeper"),
    doc="Stock levels, reorder rules and purchase quotes for a small warehouse.",
    modules={
        0: ("pricing", "rates", "costs"),
        1: ("rules", "reorder", "policies"),
        2: ("inventory", "stock"),
    },
    module_docs={
        0: "Prices, taxes and shortfalls.",
        1: "Reorder rules and order totals.",
        2: "The stock register.",
    },
    names={
        "unit_price": ("unit_price", "price_each", "bulk_price"),
        "line_cost": ("line_cost", "cost_of_line", "line_amount"),
        "with_tax": ("with_tax", "add_tax", "gross"),
        "shortfall": ("shortfall", "missing_units", "deficit"),
        "round_up": ("round_up", "ceil_div", "whole_batches"),
        "order_total": ("order_total", "total_cost", "quote_total"),
        "reorder_amount": ("reorder_amount", "order_size", "units_to_order"),
        "low_items": ("low_items", "below_minimum", "short_items"),
        "stock_value": ("stock_value", "value_of", "worth"),
        "Inventory": ("Inventory", "Stock", "Register"),
        "add": ("add", "receive", "put"),
        "remove": ("remove", "take", "ship"),
        "to_reorder": ("to_reorder", "reorder_list", "restock_plan"),
        "quote": ("quote", "restock_cost", "price_restock"),
        "count": ("count", "level", "on_hand"),
    },
    consts={"BULK": (10, 12, 20), "BIG_BULK": (50, 100), "MINIMUM": (5, 8, 10), "BATCH": (5, 6, 10)},
    functions=(
        Fn(
            "unit_price",
            0,
            '''
def ${unit_price}(base, quantity):
    """Price of one unit: 10% off from ${BULK} units, 20% off from ${BIG_BULK} units."""
    if quantity >= ${BIG_BULK}:
        return round(base * 0.8, 2)
    if quantity >= ${BULK}:
        return round(base * 0.9, 2)
    return base
''',
        ),
        Fn(
            "line_cost",
            0,
            '''
def ${line_cost}(price, quantity):
    """Cost of an order line of `quantity` units at list price `price`."""
    cost = ${unit_price}(price, quantity) * quantity
    return round(cost, 2)
''',
        ),
        Fn(
            "with_tax",
            0,
            '''
def ${with_tax}(amount, rate):
    """`amount` plus `rate` percent tax."""
    taxed = amount + amount * rate / 100
    return round(taxed, 2)
''',
        ),
        Fn(
            "shortfall",
            0,
            '''
def ${shortfall}(level, target):
    """Units missing to reach `target` (never negative)."""
    missing = target - level
    if missing < 0:
        return 0
    return missing
''',
        ),
        Fn(
            "round_up",
            0,
            '''
def ${round_up}(units, batch):
    """The smallest multiple of `batch` that is at least `units`."""
    batches = (units + batch - 1) // batch
    return batches * batch
''',
        ),
        Fn(
            "stock_value",
            1,
            '''
def ${stock_value}(levels, prices):
    """Value of all stock at list prices."""
    worth = 0
    for name, level in levels.items():
        worth += prices.get(name, 0) * level
    return round(worth, 2)
''',
        ),
        Fn(
            "order_total",
            1,
            '''
def ${order_total}(lines, tax_rate):
    """Total of (price, quantity) order lines, with tax."""
    subtotal = 0
    for price, quantity in lines:
        subtotal += ${line_cost}(price, quantity)
    return ${with_tax}(subtotal, tax_rate)
''',
        ),
        Fn(
            "reorder_amount",
            1,
            '''
def ${reorder_amount}(level, minimum, batch):
    """Units to order to get from `level` back to `minimum`, in whole batches."""
    missing = ${shortfall}(level, minimum)
    return ${round_up}(missing, batch)
''',
        ),
        Fn(
            "low_items",
            1,
            '''
def ${low_items}(levels, minimum):
    """Names whose level is below `minimum`, in name order."""
    low = []
    for name in sorted(levels):
        if levels[name] < minimum:
            low.append(name)
    return low
''',
        ),
        Fn(
            "Inventory",
            2,
            '''
class ${Inventory}:
    """Stock levels by item name, with a minimum level for reordering."""

    def __init__(self, minimum=${MINIMUM}):
        self.levels = {}
        self.minimum = minimum

    def ${add}(self, name, units):
        """Records `units` received of `name`."""
        if units < 0:
            raise ValueError("cannot receive a negative number of units")
        self.levels[name] = self.levels.get(name, 0) + units

    def ${remove}(self, name, units):
        """Takes `units` of `name` out of stock and returns what is left."""
        have = self.levels.get(name, 0)
        if units > have:
            raise ValueError(f"only {have} {name} left")
        self.levels[name] = have - units
        return self.levels[name]

    def ${count}(self, name):
        """Units of `name` in stock."""
        return self.levels.get(name, 0)

    def ${to_reorder}(self, batch):
        """Units to order, in batches of `batch`, for every item below the minimum."""
        orders = {}
        for name in ${low_items}(self.levels, self.minimum):
            orders[name] = ${reorder_amount}(self.levels[name], self.minimum, batch)
        return orders

    def ${quote}(self, prices, tax_rate):
        """Cost of the reorder (batches of ${BATCH}) at `prices`, with tax."""
        lines = []
        for name, units in sorted(self.${to_reorder}(${BATCH}).items()):
            lines.append((prices[name], units))
        return ${order_total}(lines, tax_rate)
''',
        ),
    ),
    scenarios=(
        Scenario(
            "${add}_and_${remove}",
            "the stock left after shipping",
            ("stock = ${Inventory}()", "stock.${add}(${item}, ${a})", "stock.${add}(${item}, ${b})"),
            "stock.${remove}(${item}, ${c})",
            {"item": pick(*ITEMS), "a": ints(5, 30), "b": ints(1, 20), "c": ints(1, 5)},
        ),
        Scenario(
            "${count}_unknown_item",
            "the count of an item never received",
            ("stock = ${Inventory}()", "stock.${add}(${item}, ${a})"),
            "stock.${count}(${other})",
            {"item": pick(*ITEMS[:5]), "other": pick(*ITEMS[5:]), "a": ints(1, 9)},
        ),
        Scenario(
            "${to_reorder}_below_minimum",
            "the reorder list",
            (
                "stock = ${Inventory}(minimum=${m})",
                "stock.${add}(${i1}, ${a})",
                "stock.${add}(${i2}, ${b})",
                "stock.${add}(${i3}, ${c})",
            ),
            "stock.${to_reorder}(${batch})",
            {
                "m": ints(12, 30),
                "i1": pick(*ITEMS[:3]),
                "i2": pick(*ITEMS[3:6]),
                "i3": pick(*ITEMS[6:]),
                "a": ints(0, 11),
                "b": ints(0, 40),
                "c": ints(0, 8),
                "batch": pick(4, 5, 6, 10),
            },
        ),
        Scenario(
            "${to_reorder}_at_minimum",
            "the reorder list when an item is exactly at the minimum",
            ("stock = ${Inventory}(minimum=${m})", "stock.${add}(${i1}, ${m})", "stock.${add}(${i2}, ${b})"),
            "stock.${to_reorder}(${batch})",
            {
                "m": ints(10, 20),
                "i1": pick(*ITEMS[:5]),
                "i2": pick(*ITEMS[5:]),
                "b": ints(1, 9),
                "batch": pick(3, 4, 5),
            },
        ),
        Scenario(
            "${quote}_with_tax",
            "the restock quote",
            ("stock = ${Inventory}(minimum=${m})", "stock.${add}(${i1}, ${a})", "stock.${add}(${i2}, ${b})"),
            "stock.${quote}({${i1}: ${p1}, ${i2}: ${p2}}, ${tax})",
            {
                "m": ints(30, 120),
                "i1": pick(*ITEMS[:5]),
                "i2": pick(*ITEMS[5:]),
                "a": ints(0, 20),
                "b": ints(0, 25),
                "p1": money(1, 9),
                "p2": money(2, 20),
                "tax": pick(5, 10, 20, 21),
            },
        ),
        Scenario(
            "${remove}_too_many",
            "shipping more than is in stock",
            ("stock = ${Inventory}()", "stock.${add}(${item}, ${a})"),
            "stock.${remove}(${item}, ${b})",
            {"item": pick(*ITEMS), "a": ints(1, 9), "b": ints(10, 20)},
            raises="ValueError",
        ),
        Scenario(
            "${add}_negative",
            "receiving a negative number of units",
            ("stock = ${Inventory}()",),
            "stock.${add}(${item}, -${a})",
            {"item": pick(*ITEMS), "a": ints(1, 9)},
            raises="ValueError",
        ),
    ),
)
