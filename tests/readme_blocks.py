"""The README's fenced code blocks, read for tests/test_readme.py (no I/O here).

A block is one of three things:

- **Python** (info string ``python``): one program, run as a whole.
- **Commands**: its first line starts with a program (``python``, ``pip``, a
  program on PATH or a file of the checkout); every non-blank, non-comment line
  is a command, a line ending in ``\\`` continuing on the next.
- **Text**: anything else. A text block right after a command block, with no
  heading between them, is the *sample output* of that block's last command
  (the README's "at the end a summary:"); other text (the layout) is ignored.

Commands are kept as printed; the helpers below make the substitutions a test
needs (the test web's real ports, placeholders) without changing anything else.

Run as a program, it prints the commands of one README section, one a line, as printed
(``python3 tests/readme_blocks.py '## Run the tests'``): .ci/run runs the README's
install and test sections that way, so CI runs what a newcomer types.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

PYTHON_LANGS = frozenset({"python", "py", "python3"})
SHELL_LANGS = frozenset({"", "sh", "bash", "shell", "console"})
ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
# A placeholder is an all-capitals word (PATH, HEXKEY, DIR) that is not an environment
# assignment (KVSTORE_PURE_PYTHON=1) nor part of a longer word or option.
PLACEHOLDER = re.compile(r"(?<![\w=])[A-Z][A-Z0-9_]+(?![\w=])")
# The README's stand-in for the CA file the test web prints (its directory is random).
CA_PLACEHOLDER = re.compile(r"\S*testweb-tls-X+/ca\.pem")


@dataclass(frozen=True)
class Block:
    line: int  # README line of the opening fence
    lang: str
    lines: tuple[tuple[int, str], ...]  # (README line, text) of the block's body
    section: int  # how many headings come before it


@dataclass(frozen=True)
class Command:
    line: int  # README line where the command starts
    text: str  # as printed (comment included), continuation lines joined by a space
    python: bool = False  # a Python block: ``text`` is the program
    sample: tuple[str, ...] = ()  # the output lines the README shows for it

    @property
    def code(self) -> str:
        return self.text if self.python else split_comment(self.text)[0]


def fenced_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    section = 0
    fence: tuple[int, str] | None = None
    body: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if fence is None:
            if line.startswith("```"):
                fence, body = (number, line[3:].strip().lower()), []
            elif line.startswith("#"):
                section += 1
        elif line.startswith("```"):
            blocks.append(Block(fence[0], fence[1], tuple(body), section))
            fence = None
        else:
            body.append((number, line))
    if fence is not None:
        raise ValueError(f"README line {fence[0]}: a code block is never closed")
    return blocks


def split_comment(line: str) -> tuple[str, str]:
    """``(code, comment)``: a ``#`` after whitespace starts a shell comment (a URL's
    ``#fragment`` does not; the README quotes no ``#``)."""
    match = re.search(r"(?:^|\s)#", line)
    if match is None:
        return line.rstrip(), ""
    return line[: match.start()].rstrip(), line[match.start():]


def words(code: str) -> list[str]:
    """Shell words, with ``&&``, ``|``, ``;``, ``<``, ``>`` as words of their own."""
    lexer = shlex.shlex(code, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def program(command_words: list[str]) -> str | None:
    """The program a simple command runs (environment assignments skipped)."""
    for word in command_words:
        if not ENV_ASSIGNMENT.match(word):
            return word
    return None


def _is_command(line: str, is_program: Callable[[str], bool]) -> bool:
    code = split_comment(line)[0].strip().removesuffix("\\")
    if not code:
        return False
    try:
        first = program(words(code))
    except ValueError:  # unbalanced quotes: prose, not a command
        return False
    return first is not None and is_program(first)


def _shell_commands(block: Block) -> list[Command]:
    out: list[Command] = []
    pending: list[str] = []
    start = 0
    for number, line in block.lines:
        stripped = line.strip()
        if not pending:
            if not stripped or stripped.startswith("#"):
                continue
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        out.append(Command(start, " ".join(pending)))
        pending = []
    if pending:
        raise ValueError(f"README line {start}: a command ends in a continuation '\\'")
    return out


def commands(text: str, is_program: Callable[[str], bool]) -> list[Command]:
    """Every command and Python program of the README, in order, with sample outputs."""
    out: list[Command] = []
    previous: Block | None = None  # the last block, if it held commands
    for block in fenced_blocks(text):
        first = next((t for _, t in block.lines if t.strip()), "")
        if block.lang in PYTHON_LANGS:
            body = "\n".join(t for _, t in block.lines) + "\n"
            out.append(Command(block.line + 1, body, python=True))
            previous = None
        elif block.lang in SHELL_LANGS and _is_command(first, is_program):
            found = _shell_commands(block)
            out += found
            previous = block if found else None
        else:
            if previous is not None and previous.section == block.section and out:
                last = out[-1]
                sample = tuple(t for _, t in block.lines if t.strip())
                out[-1] = Command(last.line, last.text, last.python, last.sample + sample)
            previous = None
    return out


def sample_heads(sample: tuple[str, ...]) -> list[str]:
    """What a sample output line promises: its text up to the first digit or the first
    absolute path (numbers and temporary directories differ from run to run), e.g.
    ``crawl complete: {"complete": true, "fetched":`` or ``demo: wrote the report:``.
    Lines whose head is shorter than 4 characters promise nothing checkable."""
    heads = []
    for line in sample:
        head = re.match(r"(?:[^\d\s]|\s(?!/))*", line.strip())
        assert head is not None
        if len(head.group().strip()) >= 4:
            heads.append(head.group().strip())
    return heads


def option_value(command_words: list[str], option: str) -> str | None:
    for i, word in enumerate(command_words[:-1]):
        if word == option:
            return command_words[i + 1]
        if word.startswith(option + "="):
            return word.split("=", 1)[1]
    return None


def with_ports_zero(code: str, options: tuple[str, ...]) -> str:
    """``code`` with each ``--OPTION N`` of ``options`` set to 0 (any free port); the
    options it does not give are added as 0 (their defaults are fixed ports too)."""
    for option in options:
        pattern = re.compile(rf"(?<!\S){re.escape(option)}(?:\s+|=)\d+(?!\S)")
        if pattern.search(code):
            code = pattern.sub(f"{option} 0", code)
        else:
            code += f" {option} 0"
    return code


@dataclass(frozen=True)
class WebValues:
    """What ``python -m tools.testweb serve`` printed, and the ports the README gave it."""

    http_port: int
    https_port: int
    nameserver: str  # IP:PORT
    ca_file: str
    readme_http_port: str | None
    readme_https_port: str | None
    readme_dns_port: str | None

    @classmethod
    def parse(cls, printed: str, readme_words: list[str]) -> WebValues:
        http = re.search(r"^http: [\d.]+:(\d+)\s+https: [\d.]+:(\d+)", printed, re.M)
        ns = re.search(r"^nameserver: ([\d.]+:\d+)", printed, re.M)
        ca = re.search(r"^ca: (\S+)", printed, re.M)
        if not (http and ns and ca):
            raise ValueError(f"no http/https/nameserver/ca lines in what it printed: {printed!r}")
        return cls(
            int(http.group(1)),
            int(http.group(2)),
            ns.group(1),
            ca.group(1),
            option_value(readme_words, "--port"),
            option_value(readme_words, "--https-port"),
            option_value(readme_words, "--dns-port"),
        )

    def substitute(self, code: str) -> str:
        """The README's ports and CA path replaced by the running web's."""
        if self.readme_dns_port:
            code = re.sub(rf"\b127\.0\.0\.1:{self.readme_dns_port}(?!\d)", self.nameserver, code)
        for readme, real in ((self.readme_http_port, self.http_port),
                             (self.readme_https_port, self.https_port)):
            if readme:  # a port in a URL: after a host name or an IP
                code = re.sub(rf"(?<=[\w.\]]):{readme}(?!\d)", f":{real}", code)
        return CA_PLACEHOLDER.sub(self.ca_file, code)


def uses_web(code: str, readme_ports: Mapping[str, str | None]) -> bool:
    """Whether a command names the test web's README ports or CA file."""
    if CA_PLACEHOLDER.search(code):
        return True
    return any(port and re.search(rf"[\w.\]]:{port}(?!\d)", code)
               for port in readme_ports.values())


def placeholders(code: str) -> list[str]:
    return PLACEHOLDER.findall(code)


def fill_placeholders(code: str, values: Mapping[str, str]) -> str:
    return PLACEHOLDER.sub(lambda m: values[m.group()], code)


def section(text: str, heading: str) -> str:
    """``text`` with every line outside the section under ``heading`` (a whole heading
    line, e.g. ``## Run the tests``) blanked, so line numbers stay the README's. The
    section ends at the next heading of its level or above."""
    level = len(heading) - len(heading.lstrip("#"))
    out: list[str] = []
    inside = found = fence = False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            if line.strip() == heading.strip():
                inside = found = True
            elif inside and len(line) - len(line.lstrip("#")) <= level:
                inside = False
        out.append(line if inside else "")
    if not found:
        raise ValueError(f"the README has no heading {heading!r}")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    """``readme_blocks.py HEADING [README]``: the section's commands, one a line."""
    if not 1 <= len(argv) <= 2:
        print("usage: python3 tests/readme_blocks.py '## HEADING' [README.md]", file=sys.stderr)
        return 2
    readme = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parents[1] / "README.md")

    def is_program(word: str) -> bool:
        return (word in ("python", "python3", "pip", "pip3") or shutil.which(word) is not None
                or (readme.parent / word).is_file())

    try:
        found = commands(section(readme.read_text(encoding="utf-8"), argv[0]), is_program)
    except ValueError as exc:
        print(f"{readme}: {exc}", file=sys.stderr)
        return 1
    if not found or any(c.python for c in found):
        print(f"{readme}: {argv[0]!r} has no commands, or a Python block", file=sys.stderr)
        return 1
    for command in found:
        print(command.code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
