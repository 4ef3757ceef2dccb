"""A row filter's text (core/content/row_filter.py): its tokens, and MySQL's grammar and
precedence, parsed into tuples that the binder checks against the table's columns.

The text is read as MySQL reads it under the default sql_mode (backslash escapes, ``||`` is OR,
"…" is a string). The language is what can be evaluated exactly as MySQL evaluates it; everything
else is refused by name rather than guessed:

* logic: ``AND`` / ``&&``, ``OR`` / ``||``, ``XOR``, ``NOT`` / ``!``, parentheses, MySQL's
  precedence and three-valued logic (a row is selected only when the filter is TRUE);
* ``IS [NOT] NULL`` (any column or condition), ``IS [NOT] TRUE / FALSE / UNKNOWN``; a numeric
  column alone as a condition means ``<> 0``, as in MySQL;
* ``= <> != < <= > >= <=>`` between a column and a constant (either side) or two columns of one
  comparable kind; ``[NOT] IN (constant, …)``; ``[NOT] BETWEEN constant AND constant``;
* constants: integers and decimals (exact, at most 65 digits, 30 after the point), quoted
  strings with MySQL's escapes ('' \\' \\n \\t \\0 \\Z \\\\ …; adjacent strings join),
  ``_utf8mb4'…'`` / ``_utf8mb4 X'…'``, ``X'…'`` / ``0x…`` (binary columns only), TRUE, FALSE,
  NULL, and ``DATE'…'`` / ``TIMESTAMP'…'`` / ``TIME'…'``.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import NamedTuple

# --- tokens ------------------------------------------------------------------------------------


class _Token(NamedTuple):
    kind: str  # num, str, hex, ident (backquoted), word, op, end
    value: object  # num: int | Decimal; str: str; hex: bytes; ident: name; word: upper case; op: text
    pos: int
    text: str


_SPACE = " \t\n\r\f\v"
_WORD = re.compile(r"[0-9A-Za-z_$\u0080-\uffff]+")
_NUMBER = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")  # ASCII digits only, as MySQL
_OPS = ("<=>", "<=", ">=", "<>", "!=", "&&", "||", "<<", ">>", "<", ">", "=", "!", "(", ")", ",", "-", "+", "*",
        "/", "%", "&", "|", "^", "~")
_ESCAPES = {"0": "\0", "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a"}
# characters no construct of the language starts with, by what they would start in MySQL
_FOREIGN = {"@": "variables (@var, @@var)", "?": "placeholders (?)", ";": "more than one statement (;)",
            "{": "ODBC escapes ({d '…'})", "}": "ODBC escapes ({d '…'})", "\\": "\\N (write NULL)",
            ":": "assignments (:=)", ".": "qualified names (t.col) and table references",
            "[": "brackets", "]": "brackets"}


def _lex(text: str, fail) -> list[_Token]:
    tokens, i, n = [], 0, len(text)
    while i < n:
        ch = text[i]
        if ch in _SPACE:
            i += 1
        elif ch == "#" or text.startswith(("/*", "--"), i):
            fail(f"comments (and '--', at character {i + 1}) cannot be used in a row filter; remove them")
        elif ch in "'\"":
            value, end = _string(text, i, fail)
            tokens.append(_Token("str", value, i, text[i:end]))
            i = end
        elif ch == "`":
            end = i + 1
            while True:
                end = text.find("`", end)
                if end < 0:
                    fail(f"the quoted name at character {i + 1} has no closing backquote")
                if not text.startswith("``", end):
                    break
                end += 2
            name = text[i + 1:end].replace("``", "`")
            if not name:
                fail(f"the empty quoted name at character {i + 1} is no column's name")
            tokens.append(_Token("ident", name, i, text[i:end + 1]))
            i = end + 1
        elif _NUMBER.match(text, i):
            i = _number(text, i, tokens, fail)
        elif _WORD.match(text, i):
            word = _WORD.match(text, i).group()
            end = i + len(word)
            quoted = text.startswith("'", end)
            if quoted and word in ("X", "x"):
                close = text.find("'", end + 1)
                digits = text[end + 1:close] if close > 0 else "?"
                if not re.fullmatch(r"(?:[0-9A-Fa-f]{2})*", digits):
                    fail(f"the hex literal at character {i + 1} is malformed: write X'…' with an even number of "
                         "hex digits")
                tokens.append(_Token("hex", bytes.fromhex(digits), i, text[i:close + 1]))
                i = close + 1
            elif quoted and word in ("B", "b"):
                fail(f"bit literals (b'…', at character {i + 1}) are not supported; write the number in decimal")
            elif quoted and word in ("N", "n"):
                fail(f"national string literals (N'…', at character {i + 1}) are not supported; write '…'")
            else:
                tokens.append(_Token("word", word.upper(), i, word))
                i = end
        else:
            op = next((o for o in _OPS if text.startswith(o, i)), None)
            if op is None:
                what = _FOREIGN.get(ch, f"the character {ch!r}")
                fail(f"{what} (at character {i + 1}) cannot be used in a row filter")
            tokens.append(_Token("op", op, i, op))
            i += len(op)
    tokens.append(_Token("end", None, n, "end of the filter"))
    return tokens


def _string(text: str, i: int, fail) -> tuple[str, int]:
    """The quoted string at ``i`` with MySQL's escapes (sql_mode without NO_BACKSLASH_ESCAPES)."""
    quote, out, j = text[i], [], i + 1
    while j < len(text):
        ch = text[j]
        if ch == "\\" and j + 1 < len(text):
            nxt = text[j + 1]
            out.append("\\" + nxt if nxt in "%_" else _ESCAPES.get(nxt, nxt))  # \% and \_ keep their backslash
            j += 2
        elif ch == quote and text.startswith(quote * 2, j):
            out.append(quote)
            j += 2
        elif ch == quote:
            return "".join(out), j + 1
        else:
            out.append(ch)
            j += 1
    fail(f"the string at character {i + 1} has no closing quote")


def _number(text: str, i: int, tokens: list, fail) -> int:
    word = _WORD.match(text, i)
    if word and re.fullmatch(r"0x[0-9A-Fa-f]+", word.group()):
        digits = word.group()[2:]
        tokens.append(_Token("hex", bytes.fromhex(digits.rjust(len(digits) + len(digits) % 2, "0")), i, word.group()))
        return word.end()
    match = _NUMBER.match(text, i)
    literal, end = match.group(), match.end()
    if _WORD.match(text, end):
        fail(f"{text[i:_WORD.match(text, end).end()]!r} at character {i + 1} is neither a number nor a name: quote a "
             "column name that starts with a digit with backquotes (bit literals 0b… are not supported)")
    if "e" in literal.lower():
        fail(f"the floating-point literal {literal} (at character {i + 1}) is not supported (MySQL compares it as a "
             "double): write it as a decimal number")
    digits = literal.replace(".", "").lstrip("0")
    fraction = literal.partition(".")[2]
    if len(digits) > 65 or len(fraction) > 30:
        fail(f"the number {literal} has more than 65 digits or 30 after the point (MySQL would read it as a double)")
    tokens.append(_Token("num", Decimal(literal) if "." in literal else int(literal), i, literal))
    return end


# --- parsing: MySQL's grammar and precedence, into tuples checked by the binder (row_filter.py) ---

_COMPARISONS = ("=", "<=>", "<>", "!=", "<", "<=", ">", ">=")
_ARITHMETIC = ("+", "-", "*", "/", "%", "&", "|", "^", "~", "<<", ">>")
_GRAMMAR = {"AND", "OR", "XOR", "NOT", "IS", "IN", "BETWEEN", "UNKNOWN"}
_REFUSED = {
    "LIKE": "LIKE (pattern matching)", "RLIKE": "REGEXP / RLIKE", "REGEXP": "REGEXP / RLIKE",
    "SOUNDS": "SOUNDS LIKE", "MEMBER": "MEMBER OF", "ESCAPE": "LIKE … ESCAPE",
    "CASE": "CASE expressions", "WHEN": "CASE expressions", "THEN": "CASE expressions", "ELSE": "CASE expressions",
    "END": "CASE expressions", "SELECT": "subqueries", "EXISTS": "subqueries (EXISTS)", "ANY": "ANY (subquery)",
    "ALL": "ALL (subquery)", "SOME": "SOME (subquery)", "INTERVAL": "INTERVAL arithmetic", "BINARY": "BINARY casts",
    "COLLATE": "COLLATE (the column's own collation is used)", "DIV": "arithmetic (DIV)", "MOD": "arithmetic (MOD)",
    "MATCH": "full-text search (MATCH … AGAINST)", "AGAINST": "full-text search (MATCH … AGAINST)",
    "ROW": "row constructors", "DEFAULT": "DEFAULT()", "VALUES": "VALUES()", "DISTINCT": "DISTINCT",
    "FROM": "a FROM clause", "WHERE": "a WHERE clause (write only the condition)", "UNION": "UNION",
    "ORDER": "ORDER BY", "GROUP": "GROUP BY", "HAVING": "HAVING", "LIMIT": "LIMIT",
}


class Parser:
    def __init__(self, text: str, names: set[str], fail):
        self.names = names  # the table's column names, upper case: such a word is a column unless it is grammar
        self.fail = fail
        self.tokens = _lex(text, fail)
        self.i = 0

    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def take(self) -> _Token:
        token = self.peek()
        self.i += 1
        return token

    def word(self, *names, ahead: int = 0) -> bool:
        token = self.peek(ahead)
        return token.kind == "word" and token.value in names

    def op(self, *ops) -> bool:
        return self.peek().kind == "op" and self.peek().value in ops

    def unexpected(self, token: _Token):
        if token.kind == "word" and token.value in _REFUSED:
            self.fail(f"{_REFUSED[token.value]} (at character {token.pos + 1}) cannot be used in a row filter: it "
                      "is not evaluated exactly as MySQL does; write comparisons, IN, BETWEEN and IS tests")
        if token.kind == "op" and token.value in _ARITHMETIC:
            self.fail(f"arithmetic ({token.text}, at character {token.pos + 1}) cannot be used in a row filter: "
                      "compare a column with a constant or another column")
        if token.kind == "op" and token.value == ",":
            self.fail(f"a ',' at character {token.pos + 1}: row constructors and function arguments are not supported")
        self.fail(f"syntax error: unexpected {token.text!r} at character {token.pos + 1}")

    def parse(self):
        if self.peek().kind == "end":
            self.fail("the filter is empty")
        node = self.or_()
        if self.peek().kind != "end":
            self.unexpected(self.peek())
        return node

    def or_(self):
        node = self.xor()
        while self.word("OR") or self.op("||"):
            self.take()
            node = ("OR", node, self.xor())
        return node

    def xor(self):
        node = self.and_()
        while self.word("XOR"):
            self.take()
            node = ("XOR", node, self.and_())
        return node

    def and_(self):
        node = self.not_()
        while self.word("AND") or self.op("&&"):
            self.take()
            node = ("AND", node, self.not_())
        return node

    def not_(self):
        if self.word("NOT"):
            self.take()
            return ("NOT", self.not_())
        return self.test()

    def test(self):
        """Comparisons and IS tests, left-associative at one level (MariaDB's boolean_test)."""
        node = self.predicate()
        while True:
            if self.word("IS"):
                start = self.take().pos
                negated = self.word("NOT") and bool(self.take())
                what = self.take()
                if what.kind != "word" or what.value not in ("NULL", "TRUE", "FALSE", "UNKNOWN"):
                    self.fail(f"IS at character {start + 1} must be followed by [NOT] NULL, TRUE, FALSE or UNKNOWN")
                node = ("IS", node, what.value, negated)
            elif self.op(*_COMPARISONS):
                op = self.take()
                node = ("CMP", "<>" if op.value == "!=" else op.value, node, self.predicate(), op.pos)
            else:
                return node

    def predicate(self):
        node = self.value()
        negated = self.word("NOT") and self.word("IN", "BETWEEN", "LIKE", "REGEXP", "RLIKE", ahead=1)
        if negated:
            self.take()
        if self.word("IN"):
            start = self.take().pos
            if not self.op("("):
                self.fail(f"IN at character {start + 1} must be followed by a parenthesised list of constants")
            self.take()
            items = [self.value()]
            while self.op(","):
                self.take()
                items.append(self.value())
            if not self.op(")"):
                self.unexpected(self.peek())
            self.take()
            return ("IN", node, items, negated, start)
        if self.word("BETWEEN"):
            start = self.take().pos
            low = self.value()
            if not self.word("AND"):
                self.unexpected(self.peek())
            self.take()
            return ("BETWEEN", node, low, self.value(), negated, start)
        if negated or self.word(*_REFUSED):
            self.unexpected(self.peek())
        return node

    def value(self):
        """An operand: a unary expression not followed by arithmetic."""
        node = self.unary()
        if self.op(*_ARITHMETIC) or self.word("DIV", "MOD", "COLLATE"):
            self.unexpected(self.peek())
        return node

    def unary(self):
        token = self.peek()
        if token.kind == "op" and token.value == "!":
            self.take()
            return ("BANG", self.unary(), token.pos)
        if token.kind == "op" and token.value in ("-", "+"):
            self.take()
            number = self.take()
            if number.kind != "num":
                self.fail(f"the sign {token.text} at character {token.pos + 1} applies to something other than a "
                          "number: arithmetic cannot be used in a row filter")
            return ("LIT", "num", -number.value if token.value == "-" else number.value, token.pos)
        return self.primary()

    def joined(self, text: str) -> str:
        """A string and the strings right after it: 'a' 'b' is 'ab', as in MySQL."""
        while self.peek().kind == "str":
            text += self.take().value
        return text

    def primary(self):
        token = self.take()
        nxt = self.peek()
        if token.kind == "op" and token.value == "(":
            node = self.or_()
            if not self.op(")"):
                self.unexpected(self.peek())
            self.take()
            return ("PAREN", node)
        if token.kind in ("num", "hex"):
            return ("LIT", token.kind, token.value, token.pos)
        if token.kind == "str":
            return ("LIT", "str", self.joined(token.value), token.pos)
        if token.kind == "ident":
            return ("COL", token.value, token.pos)
        if token.kind != "word":
            self.unexpected(token)
        name = token.value
        if name in ("TRUE", "FALSE"):
            return ("LIT", "bool", int(name == "TRUE"), token.pos)
        if name == "NULL":
            return ("LIT", "null", None, token.pos)
        if name in ("DATE", "TIME", "TIMESTAMP") and nxt.kind == "str":
            self.take()
            return ("LIT", name.lower(), nxt.value, token.pos)
        if name.startswith("_") and nxt.kind in ("str", "hex"):
            if name != "_UTF8MB4":
                self.fail(f"the character set introducer {token.text} (at character {token.pos + 1}) cannot be used "
                          "in a row filter; write the string without it, or with _utf8mb4")
            self.take()
            if nxt.kind == "str":
                return ("LIT", "str", self.joined(nxt.value), token.pos)
            try:
                return ("LIT", "str", nxt.value.decode("utf-8"), token.pos)
            except UnicodeDecodeError:
                self.fail(f"_utf8mb4 {nxt.text} (at character {token.pos + 1}) is not UTF-8")
        if name in _GRAMMAR or (name in _REFUSED and name not in self.names):
            self.unexpected(token)
        if nxt.kind == "op" and nxt.value == "(":
            self.fail(f"function calls ({token.text}(…), at character {token.pos + 1}) are not supported")
        return ("COL", token.text, token.pos)
