"""README.md and docs/ as a reference: the flag tables of README.md and docs/flags.md list
exactly the flags of `flags.FLAGS`, the README opens with the two commands, and every
relative link of README.md and docs/*.md names a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tfxla_lite import flags

ROOT = Path(__file__).resolve().parents[2]
# A table row's first cell names one or more flags: "| `--min_cluster_size=N`, `--max...` |";
# a value list inside it escapes its bars ("on\|off").
_CELL_SEPARATOR = re.compile(r"(?<!\\)\|")
_NAME = re.compile(r"`--([a-z_]+)")


def documented_flags(text: str) -> list[str]:
    names = []
    for line in text.splitlines():
        cells = _CELL_SEPARATOR.split(line)
        if line.startswith("| `--") and len(cells) > 2:
            names.extend(_NAME.findall(cells[1]))
    return names


@pytest.mark.parametrize("page", ["README.md", "docs/flags.md"])
def test_every_flag_is_documented_once(page: str) -> None:
    names = documented_flags((ROOT / page).read_text(encoding="utf-8"))
    assert sorted(set(names)) == sorted(names), f"{page} lists a flag twice"
    missing = sorted(set(flags.FLAGS) - set(names))
    unknown = sorted(set(names) - set(flags.FLAGS))
    assert not missing, f"{page}'s flag table lacks {missing}"
    assert not unknown, f"{page}'s flag table lists flags flags.py does not have: {unknown}"


def test_row_parser_reads_a_shared_row() -> None:
    rows = ("| `--min_cluster_size=N`, `--max_cluster_size=N` | bounds |\n"
            "| `--cache=on\\|off` | `--verify` named in a description |\n")
    assert documented_flags(rows) == ["min_cluster_size", "max_cluster_size", "cache"]


def test_readme_opens_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first_block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert text.index("## The two commands") < text.index("## Using it")
    for command in commands:
        assert (ROOT / command.split()[1]).is_file()


_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", ["README.md", *sorted(
    str(path.relative_to(ROOT)) for path in (ROOT / "docs").glob("*.md"))])
def test_relative_links_name_existing_files(page: str) -> None:
    source = ROOT / page
    missing = [target for target in _LINK.findall(source.read_text(encoding="utf-8"))
               if "://" not in target and not (source.parent / target).exists()]
    assert not missing, f"{page} links to files that do not exist: {missing}"
