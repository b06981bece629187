"""The characters of HLO text to tokens: `Scanner`, and `ParseError` with its caret.

The lexical layer under `parser.py` (and `stack_frames.py`'s tables): whitespace and
comments (`/*index=5*/`, `// ...`) skipped before each token, names with XLA's
characters (`%add.1`, `copy-start`), integers, strings with C escapes, and attribute
values read as balanced text for the attributes the IR keeps verbatim.
"""

from __future__ import annotations

import re

SPACE = re.compile(r"(?:\s+|/\*.*?\*/|//[^\n]*)*", re.S)
NAME = re.compile(r"%?([A-Za-z_](?:[A-Za-z0-9_.]|-(?!>))*)")
INTEGER = re.compile(r"[-+]?\d+(?![\d.eE])")


class ParseError(ValueError):
    """Malformed HLO text; says where (line, column, a caret under the text) and why."""

    def __init__(self, message: str, text: str = "", position: int = 0) -> None:
        position = max(0, min(position, len(text)))
        start = text.rfind("\n", 0, position) + 1
        end = text.find("\n", position)
        self.message = message
        self.line = text.count("\n", 0, position) + 1
        self.column = position - start + 1
        self.source_line = text[start:len(text) if end < 0 else end]
        super().__init__(self._describe())

    def _describe(self) -> str:
        line, column = self.source_line, self.column - 1
        if len(line) > 100:  # show a window around the column
            first = max(0, column - 60)
            line = ("..." if first else "") + line[first:first + 100]
            column = column - first + (3 if first else 0)
        return (f"line {self.line}, column {self.column}: {self.message}\n"
                f"  {line}\n  {' ' * column}^")


class Scanner:
    """Characters to tokens on demand: whitespace and comments skipped before each."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def skip(self) -> int:
        match = SPACE.match(self.text, self.pos)
        self.pos = match.end() if match else self.pos
        return self.pos

    def error(self, message: str, position: int | None = None) -> ParseError:
        at = self.skip() if position is None else position
        found = re.match(r"[^\s,(){}\[\]]{1,30}|\S", self.text[at:at + 30])
        where = f"'{found.group(0)}'" if found else "end of input"
        return ParseError(f"{message}, found {where}", self.text, at)

    def peek(self, literal: str) -> bool:
        self.skip()
        return self.text.startswith(literal, self.pos)

    def accept(self, literal: str) -> bool:
        if self.peek(literal):
            self.pos += len(literal)
            return True
        return False

    def expect(self, literal: str, what: str | None = None) -> None:
        if not self.accept(literal):
            raise self.error(f"expected {what or repr(literal)}")

    def match(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        self.skip()
        match = pattern.match(self.text, self.pos)
        if match:
            self.pos = match.end()
        return match

    def name(self, what: str = "a name") -> str:
        match = self.match(NAME)
        if not match:
            raise self.error(f"expected {what}")
        return match.group(1)

    def peek_word(self) -> str | None:
        self.skip()
        match = NAME.match(self.text, self.pos)
        return match.group(0) if match else None

    def integer(self, what: str = "an integer") -> int:
        match = self.match(INTEGER)
        if not match:
            raise self.error(f"expected {what}")
        return int(match.group(0))

    def string(self) -> str:
        """A double-quoted string with C escapes; returns its contents."""
        start = self.skip()
        end = self._string_end(start)
        body = self.text[start + 1:end - 1]
        return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)),
                      body, flags=re.S)

    def _string_end(self, start: int) -> int:
        if not self.text.startswith('"', start):
            raise self.error("expected a string", start)
        at = start + 1
        while at < len(self.text):
            char = self.text[at]
            if char == "\\":
                at += 2
                continue
            if char == '"':
                self.pos = at + 1
                return at + 1
            if char == "\n":
                break
            at += 1
        raise ParseError("unterminated string", self.text, start)

    def braced(self) -> str:
        """A `{...}` group as text, up to its matching '}' (strings skipped)."""
        start = self.skip()
        depth = 0
        at = start
        while at < len(self.text):
            char = self.text[at]
            if char == '"':
                at = self._string_end(at)
                continue
            depth += {"{": 1, "}": -1}.get(char, 0)
            at += 1
            if depth == 0:
                self.pos = at
                return self.text[start:at]
        raise ParseError("unbalanced braces", self.text, start)

    def raw_value(self) -> str:
        """An attribute value as text: up to a ',' or line end outside brackets and strings."""
        start = self.skip()
        closing: list[str] = []  # the closers the open brackets expect, innermost last
        at = start
        pairs = {"{": "}", "(": ")", "[": "]"}
        while at < len(self.text):
            char = self.text[at]
            if char == '"':
                at = self._string_end(at)
                continue
            if char in pairs:
                closing.append(pairs[char])
            elif char in "})]":
                if not closing:
                    break
                if closing.pop() != char:
                    raise ParseError("unbalanced brackets in attribute value", self.text, at)
            elif not closing and char in ",\n":
                break
            at += 1
        if closing:
            raise ParseError("unbalanced brackets in attribute value", self.text, start)
        value = self.text[start:at].rstrip()
        if not value:
            raise self.error("expected an attribute value", start)
        self.pos = at
        return value
