"""The subscription filter language (Pub/Sub's filter syntax over message attributes): parser and AST.

Contract: ``parse(text)`` turns a filter into an immutable AST (``FilterExpr``), or raises
``InvalidArgument("filter", "at N: <problem>")`` where N is the **1-based character
position** (not byte) in `text` of the first character that breaks the grammar (for an
unexpected end, the position just past the last character). Pure: no I/O. The empty string
is "no filter" and is not parsed here (the subscription field maps it to None); the 256-byte
limit is the field's check (``types.MAX_FILTER_BYTES``), made before parsing.

Grammar (whitespace = space, tab, CR, LF; allowed between any two tokens)::

    filter     = expression END
    expression = unary { "AND" unary }            (one operator only: AND and OR are
               | unary { "OR" unary }              never mixed without parentheses)
    unary      = ( "NOT" | "-" ) unary | primary  (NOT binds tightest)
    primary    = "(" expression ")" | condition
    condition  = "attributes" ":" key                          has the key
               | "attributes" "." key "=" string               has the key with that value
               | "attributes" "." key "!=" string              not (has the key with that value)
               | "hasPrefix" "(" "attributes" "." key "," string ")"
    key        = name | string
    name       = 1*( letter | digit | "_" | "-" )              ASCII letters and digits
    string     = '"' { char | escape } '"' | "'" { char | escape } "'"
    escape     = "\\" ( "a" | "b" | "f" | "n" | "r" | "t" | "v" | "\\" | "'" | '"' | "?" | "`"
               | "x" 2hex | "u" 4hex | "U" 8hex | 3octal )

Rules carried over from Pub/Sub's filtering documentation:

- Keywords and names are case-sensitive: ``AND``, ``OR``, ``NOT`` are upper case (``and`` is
  an error, not a name), ``attributes`` and ``hasPrefix`` exactly so. A keyword is a whole
  word: ``NOTE`` is not ``NOT``.
- AND and OR cannot be combined without parentheses: ``a AND b OR c`` is an error;
  ``a AND (b OR c)`` is not. Each side of an operator is a complete condition:
  ``attributes.k = "a" OR "b"`` is an error.
- ``-`` is the same as ``NOT``: ``-attributes:k``.
- A key with any character other than letters, digits, ``_`` and ``-`` is written as a string
  literal: ``attributes."iana.org/language_tag" = "en"``. Values are always string literals.
- Keys and values match exactly (case-sensitive, no trimming). ``attributes.k != "v"`` is
  true for a message without the key ``k`` (it is ``NOT attributes.k = "v"``), as in
  Pub/Sub and its Go test server; ``hasPrefix`` is false for a message without the key.
- ``hasPrefix`` is the only function.

Nesting is capped at ``MAX_DEPTH`` levels (parentheses and negations), far more than a
256-byte filter can hold in practice, so the recursive parser and compiler stay well inside
Python's recursion limit whatever text they are given.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Union

from ..errors import InvalidArgument

__all__ = [
    "And",
    "Compare",
    "CompareOp",
    "FilterExpr",
    "HasKey",
    "HasPrefix",
    "MAX_DEPTH",
    "Not",
    "Or",
    "parse",
]

MAX_DEPTH = 100

_WHITESPACE = " \t\r\n"
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_HEX = frozenset("0123456789abcdefABCDEF")
_OCTAL = frozenset("01234567")
_SIMPLE_ESCAPES = {
    "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
    "\\": "\\", "'": "'", '"': '"', "?": "?", "`": "`",
}
_HEX_ESCAPE_DIGITS = {"x": 2, "u": 4, "U": 8}
_KEYWORDS = ("AND", "OR", "NOT")


class CompareOp(enum.Enum):
    """The two value comparisons of the language."""

    EQ = "="
    NE = "!="


@dataclass(frozen=True, slots=True)
class HasKey:
    """``attributes:KEY``: the message has the attribute KEY (any value)."""

    key: str


@dataclass(frozen=True, slots=True)
class Compare:
    """``attributes.KEY = "v"`` / ``!=``; NE is true when the key is missing."""

    key: str
    op: CompareOp
    value: str


@dataclass(frozen=True, slots=True)
class HasPrefix:
    """``hasPrefix(attributes.KEY, "p")``: the message has KEY and its value starts with p."""

    key: str
    prefix: str


@dataclass(frozen=True, slots=True)
class Not:
    """``NOT e`` or ``-e``."""

    operand: FilterExpr


@dataclass(frozen=True, slots=True)
class And:
    """``e1 AND e2 AND ...`` (two or more operands)."""

    operands: tuple[FilterExpr, ...]


@dataclass(frozen=True, slots=True)
class Or:
    """``e1 OR e2 OR ...`` (two or more operands)."""

    operands: tuple[FilterExpr, ...]


FilterExpr = Union[HasKey, Compare, HasPrefix, Not, And, Or]


def parse(text: str, field: str = "filter") -> FilterExpr:
    """The AST of a non-empty filter. Raises InvalidArgument(field, "at N: problem"), N the
    1-based character position of the problem."""
    if not isinstance(text, str):
        raise InvalidArgument(field, f"must be a string, got {type(text).__name__}")
    return _Parser(text, field).filter()


class _Parser:
    """Recursive descent straight over the text (no separate token list: whether ``-`` starts
    a negation or belongs to a key depends on where it stands)."""

    def __init__(self, text: str, field: str) -> None:
        self.text = text
        self.field = field
        self.pos = 0  # 0-based index of the next character to read
        self.depth = 0

    # -- errors and low-level reading ---------------------------------------------------
    def fail(self, problem: str, at: int | None = None) -> InvalidArgument:
        return InvalidArgument(self.field, f"at {(self.pos if at is None else at) + 1}: {problem}")

    def skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in _WHITESPACE:
            self.pos += 1

    def peek(self) -> str:
        """The next character after whitespace ("" at the end)."""
        self.skip_ws()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def describe_next(self) -> str:
        self.skip_ws()
        if self.pos >= len(self.text):
            return "the end of the filter"
        word = self.word_at(self.pos)
        if word:
            return f"'{word}'"
        return f"'{self.text[self.pos]}'"

    def word_at(self, start: int) -> str:
        end = start
        while end < len(self.text) and self.text[end] in _WORD_CHARS:
            end += 1
        return self.text[start:end]

    def expect(self, token: str, what: str) -> None:
        self.skip_ws()
        if not self.text.startswith(token, self.pos):
            raise self.fail(f"expected {what}, got {self.describe_next()}")
        self.pos += len(token)

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.fail(f"nested more than {MAX_DEPTH} levels deep")

    # -- grammar ------------------------------------------------------------------------
    def filter(self) -> FilterExpr:
        expr = self.expression()
        if self.peek() == ")":
            raise self.fail("')' without a matching '('")
        if self.peek():
            raise self.fail(f"expected AND, OR or the end of the filter, got {self.describe_next()}")
        return expr

    def expression(self) -> FilterExpr:
        operands = [self.unary()]
        operator: str | None = None
        while True:
            self.skip_ws()
            start = self.pos
            word = self.word_at(start)
            if word not in ("AND", "OR"):
                if word.upper() in ("AND", "OR"):
                    raise self.fail(f"operators are upper case: write {word.upper()}, not {word}", start)
                break
            if operator is not None and word != operator:
                raise self.fail("AND and OR cannot be combined without parentheses", start)
            operator = word
            self.pos = start + len(word)
            operands.append(self.unary())
        if operator is None:
            return operands[0]
        return And(tuple(operands)) if operator == "AND" else Or(tuple(operands))

    def unary(self) -> FilterExpr:
        self.enter()
        try:
            char = self.peek()
            if char == "-":
                self.pos += 1
                return Not(self.unary())
            word = self.word_at(self.pos)
            if word == "NOT":
                self.pos += len(word)
                return Not(self.unary())
            return self.primary()
        finally:
            self.depth -= 1

    def primary(self) -> FilterExpr:
        char = self.peek()
        start = self.pos
        if char == "(":
            self.pos += 1
            expr = self.expression()
            if self.peek() != ")":
                raise self.fail(f"expected ')' to close the '(' at {start + 1}, got {self.describe_next()}")
            self.pos += 1
            return expr
        if not char:
            raise self.fail("expected a condition, got the end of the filter")
        word = self.word_at(start)
        if word == "attributes":
            self.pos += len(word)
            return self.attribute_condition()
        if word == "hasPrefix":
            self.pos += len(word)
            return self.has_prefix()
        if word in ("AND", "OR"):
            raise self.fail(f"expected a condition before {word}", start)
        if word.upper() in _KEYWORDS:
            raise self.fail(f"operators are upper case: write {word.upper()}, not {word}", start)
        if word.lower() in ("attributes", "hasprefix"):
            right = "attributes" if word.lower() == "attributes" else "hasPrefix"
            raise self.fail(f"names are case-sensitive: write {right}, not {word}", start)
        if word and self.peek_after(start + len(word)) == "(":
            raise self.fail(f"unknown function '{word}': hasPrefix is the only function", start)
        if char in "\"'":
            raise self.fail("a string must follow attributes.KEY = or != (a condition cannot be a bare value)", start)
        raise self.fail(
            f"expected a condition (attributes.KEY = \"v\", attributes:KEY, hasPrefix(...), NOT, - or '('), "
            f"got {self.describe_next()}",
            start,
        )

    def peek_after(self, index: int) -> str:
        while index < len(self.text) and self.text[index] in _WHITESPACE:
            index += 1
        return self.text[index] if index < len(self.text) else ""

    def attribute_condition(self) -> FilterExpr:
        # Directly after "attributes": ":" or "." (whitespace allowed, as between any tokens).
        char = self.peek()
        if char == ":":
            self.pos += 1
            bare = self.peek() not in ("\"", "'")
            key = self.key()
            if bare and self.pos < len(self.text) and self.text[self.pos] not in _WHITESPACE + "()":
                raise self.fail("a key with characters other than letters, digits, '_' and '-' must be a quoted string")
            return HasKey(key)
        if char != ".":
            raise self.fail(f"expected ':' or '.' after attributes, got {self.describe_next()}")
        self.pos += 1
        bare = self.peek() not in ("\"", "'")
        key = self.key()
        key_end = self.pos
        self.skip_ws()
        if self.text.startswith("!=", self.pos):
            op, self.pos = CompareOp.NE, self.pos + 2
        elif self.text.startswith("=", self.pos):
            op, self.pos = CompareOp.EQ, self.pos + 1
        elif bare and self.pos == key_end and self.pos < len(self.text) and self.text[self.pos] not in "()":
            raise self.fail("a key with characters other than letters, digits, '_' and '-' must be a quoted string")
        else:
            raise self.fail(
                f"expected = or != after attributes.{key} (attributes:KEY tests for the key), got {self.describe_next()}"
            )
        return Compare(key, op, self.string("the value after " + op.value))

    def has_prefix(self) -> FilterExpr:
        if self.peek() != "(":
            raise self.fail(f"expected '(' after hasPrefix, got {self.describe_next()}")
        self.pos += 1
        self.skip_ws()
        if self.word_at(self.pos) != "attributes":
            raise self.fail(f"hasPrefix takes attributes.KEY first, got {self.describe_next()}")
        self.pos += len("attributes")
        self.expect(".", "'.' after attributes in hasPrefix")
        key = self.key()
        self.expect(",", f"',' after hasPrefix's attributes.{key}")
        prefix = self.string("hasPrefix's prefix")
        self.expect(")", "')' to close hasPrefix (it takes two arguments)")
        return HasPrefix(key, prefix)

    def key(self) -> str:
        char = self.peek()
        if char in ("\"", "'"):
            return self.string("the key")
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in _NAME_CHARS:
            self.pos += 1
        if self.pos == start:
            raise self.fail(f"expected an attribute key (a name or a quoted string), got {self.describe_next()}")
        return self.text[start : self.pos]

    def string(self, what: str) -> str:
        quote = self.peek()
        if quote not in ("\"", "'"):
            raise self.fail(f"{what} must be a quoted string, got {self.describe_next()}")
        start = self.pos
        self.pos += 1
        out: list[str] = []
        text = self.text
        while True:
            if self.pos >= len(text):
                raise self.fail("string not closed", start)
            char = text[self.pos]
            if char == quote:
                self.pos += 1
                return "".join(out)
            if char == "\\":
                out.append(self.escape())
            else:
                out.append(char)
                self.pos += 1

    def escape(self) -> str:
        start = self.pos  # at the backslash
        if start + 1 >= len(self.text):
            raise self.fail("string not closed (it ends in a backslash)", start)
        kind = self.text[start + 1]
        if kind in _SIMPLE_ESCAPES:
            self.pos += 2
            return _SIMPLE_ESCAPES[kind]
        if kind in _HEX_ESCAPE_DIGITS:
            n = _HEX_ESCAPE_DIGITS[kind]
            digits = self.text[start + 2 : start + 2 + n]
            if len(digits) != n or not set(digits) <= _HEX:
                raise self.fail(f"\\{kind} needs {n} hex digits", start)
            return self._code_point(int(digits, 16), start, 2 + n)
        if kind in _OCTAL:
            digits = self.text[start + 1 : start + 4]
            if len(digits) != 3 or not set(digits) <= _OCTAL:
                raise self.fail("an octal escape has 3 digits (\\000 to \\377)", start)
            value = int(digits, 8)
            if value > 0o377:
                raise self.fail("an octal escape has 3 digits (\\000 to \\377)", start)
            return self._code_point(value, start, 4)
        raise self.fail(f"unknown escape \\{kind}", start)

    def _code_point(self, value: int, start: int, length: int) -> str:
        if value > 0x10FFFF or 0xD800 <= value <= 0xDFFF:
            raise self.fail(f"escape {self.text[start:start + length]} is not a Unicode character", start)
        self.pos = start + length
        return chr(value)
