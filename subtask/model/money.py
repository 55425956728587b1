"""Money: exact decimals to the micro-dollar, from where an amount enters to where it is shown.

What it owns: turning whatever reports or holds an amount (an engine's float, a config string, a
JSON number in a record or a ledger row, a price times tokens) into a `Decimal` rounded to the
micro-dollar (`usd`), adding amounts (`total`), writing them to JSON (`to_json`) and showing them
(`text`).

Invariants:
- Never add, subtract or round dollars as binary floats, because the noise shows as a cent: two
  attempts of $0.135 stored as 0.13499999999999998 showed as $0.13 + $0.13 under a job total of
  $0.27. Every amount is a `Decimal` to the micro-dollar (`money.usd`) from where it enters (an
  engine's report, a config value, a record or a ledger row: older float noise reads as what it
  meant) to where it is shown exactly (`money.text`: $0.135), so shown rows add up to the shown
  total; JSON holds the exact amount as a number (`money.to_json`), and a `Decimal` refuses
  arithmetic with a float, so a missed conversion fails loudly (tests: `money::*`).
- JSON holds dollars as numbers written from these decimals: at most six decimal places and well
  under 16 significant digits, so the text in a record or a ledger row is the exact amount, and
  the files keep the shape (and the `"v"`) they always had. A reader rounds any number it finds to
  the micro-dollar, so rows written with float noise by earlier versions read as the amount they
  meant.
- `text` shows an amount exactly: cents when it is whole cents, else every digit down to the
  micro-dollar ($0.135, $0.00176). Rows shown this way add up to the total shown.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from decimal import ROUND_HALF_EVEN, Context, Decimal, InvalidOperation

MICRO = Decimal("0.000001")
ZERO = Decimal("0.000000")
# Wide enough for any amount a float can hold: quantize must never raise on a huge config value.
_CONTEXT = Context(prec=400)


def usd(value: object) -> Decimal | None:
    """`value` in dollars, rounded to the micro-dollar; None when it is not a finite number (None,
    a bool, NaN, infinity, text that is not a number). Negative amounts are returned as they are:
    callers that need money (`is_money`) say so."""
    if value is None or isinstance(value, bool):
        return None
    amount: Decimal | None
    try:
        if isinstance(value, Decimal):
            amount = value
        elif isinstance(value, int):
            amount = Decimal(value)
        elif isinstance(value, float):
            # repr is the shortest text that reads back as this float: 0.1 is Decimal("0.1"),
            # not the binary value 0.1000000000000000055511151231257827.
            amount = Decimal(repr(value)) if math.isfinite(value) else None
        elif isinstance(value, str):
            amount = Decimal(value.strip())
        else:
            return None
    except (InvalidOperation, ValueError):
        return None
    if amount is None or not amount.is_finite():
        return None
    return amount.quantize(MICRO, rounding=ROUND_HALF_EVEN, context=_CONTEXT)


def is_money(value: object) -> bool:
    """A number (not text, not a bool) that is a finite amount >= $0."""
    return money_or_none(value) is not None


def money_or_none(value: object) -> Decimal | None:
    """`usd(value)` when it is a number (not text) and money (finite, >= $0), else None: how a
    reader takes an amount from a record or a row that anyone could have written."""
    if not isinstance(value, (int, float, Decimal)):
        return None
    amount = usd(value)
    return amount if amount is not None and amount >= 0 else None


def total(amounts: Iterable[object]) -> Decimal:
    """The exact sum of the amounts that are numbers (others are skipped)."""
    return sum((a for a in (usd(v) for v in amounts) if a is not None), ZERO)


def to_json(amount: object) -> float | int | None:
    """An amount as a JSON number: the float whose shortest text is the exact decimal (0.135),
    None for anything that is not a number."""
    value = usd(amount)
    return None if value is None else float(value)


def json_default(obj: object) -> object:
    """`json.dumps(default=...)`: a Decimal as its JSON number, anything else as its text."""
    return to_json(obj) if isinstance(obj, Decimal) else str(obj)


def text(amount: object) -> str:
    """`$0.27`, `$0.135`, `$0.00176`, `$-1.50`; "-" for no amount."""
    value = usd(amount)
    if value is None:
        return "-"
    cents = value.quantize(Decimal("0.01"), context=_CONTEXT)
    shown = cents if cents == value else value.normalize(_CONTEXT)
    return "$" + format(shown, "f")


def plain(amount: object) -> str:
    """An amount as a person types it in a command: 2.5, 1000000000, 0.135 (never 1E+9)."""
    value = usd(amount)
    if value is None:
        return "-"
    return format(value.normalize(_CONTEXT), "f")
