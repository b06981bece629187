"""XLA's stack-frame tables: where in the Python source each instruction came from.

XLA prints them between the module header and the first computation (JAX's and
TF's modules carry them since `OpMetadata.stack_frame_id` replaced the inline
`source_file`/`source_line`):

    FileNames
    1 "model.py"
    FunctionNames
    1 "loss"
    FileLocations
    1 {file_name_id=1 function_name_id=1 line=12 end_line=12 column=4 end_column=30}
    StackFrames
    1 {file_location_id=1 parent_frame_id=0}

Ids count from 1 in each table; a `parent_frame_id` of 0 means no caller. An
instruction's `metadata={... stack_frame_id=1}` names its innermost frame.
`StackFrameIndex` holds the tables as read, prints them back in that form
(`printer.py`), and resolves a frame id to file, line and function. The parser
(`parser.py`) reads them through `parse_tables`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

SECTIONS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
# The id fields that point into another table, and the table they point into.
_REFERENCES = {"file_name_id": "FileNames", "function_name_id": "FunctionNames",
               "file_location_id": "FileLocations", "parent_frame_id": "StackFrames"}
_FIELD = re.compile(r"([A-Za-z_]+)=(-?\d+)")


@dataclass
class StackFrameIndex:
    """The four tables, each a list whose entry n-1 has id n."""

    file_names: list[str] = field(default_factory=list)
    function_names: list[str] = field(default_factory=list)
    file_locations: list[dict[str, int]] = field(default_factory=list)
    frames: list[dict[str, int]] = field(default_factory=list)

    def table(self, section: str) -> list[Any]:
        return {"FileNames": self.file_names, "FunctionNames": self.function_names,
                "FileLocations": self.file_locations, "StackFrames": self.frames}[section]

    def location(self, frame_id: int) -> tuple[str, int, str] | None:
        """(file, line, function) of a frame, or None when the id is not in the tables."""
        if not 1 <= frame_id <= len(self.frames):
            return None
        location_id = self.frames[frame_id - 1].get("file_location_id", 0)
        if not 1 <= location_id <= len(self.file_locations):
            return None
        location = self.file_locations[location_id - 1]
        file_id = location.get("file_name_id", 0)
        function_id = location.get("function_name_id", 0)
        file = self.file_names[file_id - 1] if 1 <= file_id <= len(self.file_names) else ""
        function = (self.function_names[function_id - 1]
                    if 1 <= function_id <= len(self.function_names) else "")
        return file, location.get("line", 0), function

    def check(self) -> str | None:
        """Why the tables do not hold together (an id pointing past its table), or None."""
        for section in ("FileLocations", "StackFrames"):
            for n, entry in enumerate(self.table(section), 1):
                for key, value in entry.items():
                    target = _REFERENCES.get(key)
                    if target is None:
                        continue
                    low = 0 if key == "parent_frame_id" else 1
                    if not low <= value <= len(self.table(target)):
                        return (f"{section} entry {n}: {key}={value} is not an id in "
                                f"{target} (1..{len(self.table(target))})")
        return None

    def to_text(self) -> str:
        blocks = []
        for section in SECTIONS:
            entries = self.table(section)
            if not entries:
                continue
            lines = [section]
            for n, entry in enumerate(entries, 1):
                if isinstance(entry, str):
                    lines.append(f'{n} "{_escape(entry)}"')
                else:
                    lines.append(f"{n} {{" + " ".join(f"{k}={v}" for k, v in entry.items())
                                 + "}")
            blocks.append("\n".join(lines))
        return "\n\n".join(blocks)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def parse_tables(scanner: Any, index: StackFrameIndex, seen: set[str]) -> None:
    """Read one table (its section word first) from `scanner` (the parser's `_Scanner`)
    into `index`; raises the scanner's ParseError on malformed text or a repeated table."""
    position = scanner.skip()
    section = scanner.name("a stack-frame table name")
    if section in seen:
        raise scanner.error(f"the {section} table is given twice", position)
    seen.add(section)
    entries = index.table(section)
    while scanner.text[scanner.skip():scanner.pos + 1].isdigit():  # entries open with ids
        at = scanner.pos
        number = scanner.integer(f"an id in {section}")
        if number != len(entries) + 1:
            raise scanner.error(f"{section} ids count from 1 in order; expected "
                                f"{len(entries) + 1}, got {number}", at)
        if section in ("FileNames", "FunctionNames"):
            entries.append(scanner.string())
            continue
        start = scanner.skip()
        scanner.expect("{", f"'{{' opening {section} entry {number}")
        close = scanner.text.find("}", scanner.pos)
        line_end = scanner.text.find("\n", scanner.pos)
        if close < 0 or 0 <= line_end < close:
            raise scanner.error(f"expected '}}' closing {section} entry {number}", start)
        body = scanner.text[scanner.pos:close]
        fields = {key: int(value) for key, value in _FIELD.findall(body)}
        if _FIELD.sub("", body).strip() or len(fields) != len(_FIELD.findall(body)):
            raise scanner.error(f"{section} entry {number} takes key=integer fields",
                                scanner.pos)
        scanner.pos = close + 1
        entries.append(fields)
