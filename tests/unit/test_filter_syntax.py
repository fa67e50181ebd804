"""The filter parser: Pub/Sub's documented examples, valid and invalid (with the 1-based position)."""

from __future__ import annotations

import pytest

from deltabus.errors import InvalidArgument
from deltabus.policy.filter_syntax import (
    MAX_DEPTH, And, Compare, CompareOp, FilterExpr, HasKey, HasPrefix, Not, Or, parse,
)

EQ, NE = CompareOp.EQ, CompareOp.NE
LANG = "iana.org/language_tag"

VALID: list[tuple[str, FilterExpr]] = [
    # Pub/Sub's filtering page, in its order.
    ("attributes:name", HasKey("name")),
    ("NOT attributes:name", Not(HasKey("name"))),
    ('attributes.name = "com"', Compare("name", EQ, "com")),
    ('attributes.name != "com"', Compare("name", NE, "com")),
    ('hasPrefix(attributes.name, "co")', HasPrefix("name", "co")),
    ('NOT hasPrefix(attributes.name, "co")', Not(HasPrefix("name", "co"))),
    (f'attributes."{LANG}" = "en"', Compare(LANG, EQ, "en")),
    (f'attributes:"{LANG}" AND NOT attributes.name = "com"', And((HasKey(LANG), Not(Compare("name", EQ, "com"))))),
    (
        f'attributes:"{LANG}" AND (attributes.name = "net" OR attributes.name = "org")',
        And((HasKey(LANG), Or((Compare("name", EQ, "net"), Compare("name", EQ, "org"))))),
    ),
    (f'attributes.name = "com" AND -attributes:"{LANG}"', And((Compare("name", EQ, "com"), Not(HasKey(LANG))))),
    # One operator repeated needs no parentheses; NOT binds tighter than AND / OR.
    ("attributes:a AND attributes:b AND attributes:c", And((HasKey("a"), HasKey("b"), HasKey("c")))),
    ("attributes:a OR attributes:b OR attributes:c", Or((HasKey("a"), HasKey("b"), HasKey("c")))),
    ("NOT attributes:a OR attributes:b", Or((Not(HasKey("a")), HasKey("b")))),
    ("NOT (attributes:a OR attributes:b)", Not(Or((HasKey("a"), HasKey("b"))))),
    ("(attributes:a AND attributes:b) OR attributes:c", Or((And((HasKey("a"), HasKey("b"))), HasKey("c")))),
    ("NOT NOT attributes:a", Not(Not(HasKey("a")))),
    ("- -attributes:a", Not(Not(HasKey("a")))),
    # Bare keys may hold letters, digits, '_' and '-'; whitespace anywhere between tokens.
    ('attributes.ce-type = "x"', Compare("ce-type", EQ, "x")),
    ("attributes:_k-1", HasKey("_k-1")),
    ('attributes.AND = "x"', Compare("AND", EQ, "x")),
    ('  ( attributes . k\t!=\n"v" )  ', Compare("k", NE, "v")),
    ('attributes.k="v"AND attributes:j', And((Compare("k", EQ, "v"), HasKey("j")))),
    ('hasPrefix( attributes . k , "" )', HasPrefix("k", "")),
    # String literals: either quote, escapes (simple, hex, unicode, octal), case kept.
    ("attributes.k = 'v'", Compare("k", EQ, "v")),
    (r'attributes.k = "a\"b\\c\'d\n\t"', Compare("k", EQ, "a\"b\\c'd\n\t")),
    (r'attributes.k = "\x41\u00e9\U0001F600\101"', Compare("k", EQ, "Aé\U0001F600A")),
    ('attributes.k = "CoM"', Compare("k", EQ, "CoM")),
    ('attributes:"みんな"', HasKey("みんな")),
    ('attributes:""', HasKey("")),
]


@pytest.mark.parametrize("text,expected", VALID, ids=[t for t, _ in VALID])
def test_valid_filters_parse_to_their_ast(text: str, expected: FilterExpr) -> None:
    assert parse(text) == expected


# (filter, 1-based position, part of the problem)
INVALID: list[tuple[str, int, str]] = [
    # Pub/Sub's documented invalid examples: AND and OR mixed, and an incomplete expression.
    (f'attributes:"{LANG}" AND attributes.name = "net" OR attributes.name = "org"', 64, "AND and OR cannot be combined"),
    ("attributes:a OR attributes:b AND attributes:c", 30, "AND and OR cannot be combined"),
    (f'attributes:"{LANG}" AND (attributes.name = "net" OR "org")', 68, "cannot be a bare value"),
    # Case-sensitive operators and names.
    ("attributes:a and attributes:b", 14, "write AND, not and"),
    ("attributes:a Or attributes:b", 14, "write OR, not Or"),
    ("not attributes:a", 1, "write NOT, not not"),
    ("Attributes:a", 1, "write attributes, not Attributes"),
    ('hasprefix(attributes.a, "x")', 1, "write hasPrefix, not hasprefix"),
    ("NOTattributes:a", 1, "expected a condition"),
    # Shape of conditions.
    ('attributes.name = com', 19, "must be a quoted string"),
    ("attributes.name", 16, "expected = or !="),
    ('attributes:name = "x"', 17, "expected AND, OR or the end"),
    ("attributes", 11, "expected ':' or '.'"),
    ('attributes.iana.org = "en"', 16, "must be a quoted string"),
    ("attributes:iana.org/x", 16, "must be a quoted string"),
    ("attributes.", 12, "expected an attribute key"),
    ('hasSuffix(attributes.a, "x")', 1, "hasPrefix is the only function"),
    ("hasPrefix(attributes.a)", 23, "expected ','"),
    ('hasPrefix(a, "x")', 11, "hasPrefix takes attributes.KEY first"),
    ('hasPrefix(attributes.a, "x", "y")', 28, "')' to close hasPrefix"),
    ('"v"', 1, "cannot be a bare value"),
    ("data:x", 1, "expected a condition"),
    # Operators, parentheses and the end.
    ("attributes:a attributes:b", 14, "expected AND, OR or the end"),
    ("AND attributes:a", 1, "expected a condition before AND"),
    ("attributes:a OR", 16, "expected a condition, got the end"),
    ("NOT", 4, "expected a condition, got the end"),
    ("   ", 4, "expected a condition, got the end"),
    ("(attributes:a", 14, "expected ')' to close the '(' at 1"),
    ("attributes:a)", 13, "')' without a matching '('"),
    ("()", 2, "expected a condition"),
    # Strings and escapes.
    ('attributes.a = "x', 16, "string not closed"),
    ("attributes.a = 'x\"", 16, "string not closed"),
    ('attributes.a = "\\q"', 17, "unknown escape \\q"),
    ('attributes.a = "\\x4"', 17, "\\x needs 2 hex digits"),
    ('attributes.a = "\\ud800"', 17, "not a Unicode character"),
    ('attributes.a = "\\400"', 17, "octal escape"),
    # Nesting is capped (the recursive parser never hits Python's recursion limit).
    ("(" * (MAX_DEPTH + 5) + "attributes:a" + ")" * (MAX_DEPTH + 5), MAX_DEPTH + 1, f"nested more than {MAX_DEPTH}"),
]


@pytest.mark.parametrize("text,position,problem", INVALID, ids=[t[:40] for t, _, _ in INVALID])
def test_invalid_filters_name_the_position_and_the_problem(text: str, position: int, problem: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse(text)
    assert err.value.field == "filter"
    assert err.value.rule.startswith(f"at {position}: "), err.value.rule
    assert problem in err.value.rule


def test_the_field_name_is_the_callers() -> None:
    with pytest.raises(InvalidArgument) as err:
        parse("attributes", field="subscription.filter")
    assert str(err.value) == "subscription.filter: at 11: expected ':' or '.' after attributes, got the end of the filter"


def test_positions_count_characters_not_bytes() -> None:
    # "é" is 2 bytes of UTF-8; the stray "y" is still character 22.
    with pytest.raises(InvalidArgument, match="at 22: expected AND, OR"):
        parse('attributes."é" = "x" y')
    # A bare key is ASCII letters, digits, '_' and '-': others are quoted.
    with pytest.raises(InvalidArgument, match="at 12: expected an attribute key"):
        parse('attributes.é = "x"')


def test_parse_refuses_a_non_string() -> None:
    with pytest.raises(InvalidArgument, match="filter: must be a string"):
        parse(3)  # type: ignore[arg-type]


def test_ast_nodes_are_frozen() -> None:
    node = HasKey("a")
    with pytest.raises(AttributeError):
        node.key = "b"  # type: ignore[misc]


def test_the_subscription_field_parses_its_filter() -> None:
    from deltabus import subscription_fields as sf

    base = {"name": "projects/p/subscriptions/sub", "topic": "projects/p/topics/top"}
    assert sf.create_settings({**base, "filter": ""}).filter == ""
    assert sf.create_settings({**base, "filter": "-attributes:a"}).filter == "-attributes:a"
    with pytest.raises(InvalidArgument) as err:
        sf.create_settings({**base, "filter": "attributes:a AND attributes:b OR attributes:c"})
    assert (err.value.field, err.value.rule) == ("filter", "at 31: AND and OR cannot be combined without parentheses")
