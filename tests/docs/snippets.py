"""The fenced snippets of the docs (README.md and docs/**/*.md) and the marks before them.

A snippet *claims an output* when it shows what a command or a program prints: a `console`
block with a line that is not a `$ ` command (or its `\\` continuation); a block right after
a `sh`/`console`/`python` block (only blank lines between) that is `json`, `text` or
unlabelled; a `python` block with a `print(...)  # ...` line. Each such snippet carries, on
the line right before its fence (for a command and its output block, before either):

- ``<!-- run -->``: tests/docs/test_snippets.py runs its `$ sie-worker ...` lines and
  compares what they print with the lines shown;
- ``<!-- tested-by: PATH::TEST -->``: the named test checks what the snippet shows;
- ``<!-- illustrative -->``: the output is an example (ports, times, machine-dependent).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MARKS", "Snippet", "claims_output", "doc_files", "snippets"]

MARKS = ("run", "tested-by", "illustrative")
_MARK = re.compile(r"^<!-- (run|illustrative|tested-by: (\S+)) -->$")
_FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
_COMMANDS = {"sh", "bash", "shell", "console", "python"}
_OUTPUTS = {"json", "text", "", "output"}


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    body: str
    mark: str | None  # run, illustrative, tested-by
    tested_by: str | None  # PATH::TEST of a tested-by mark
    follows: Snippet | None  # the command block right before this one, if any

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


def doc_files(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def snippets(path: Path) -> list[Snippet]:
    lines = path.read_text(encoding="utf-8").split("\n")
    found: list[Snippet] = []
    i = 0
    last_end = -10
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, lang = match[2], match[3].lower()
        end = next(
            (j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(fence)), len(lines)
        )
        before = lines[i - 1].strip() if i else ""
        mark = _MARK.match(before)
        between = lines[last_end + 1 : i] if last_end >= 0 else ["x"]
        previous = found[-1] if found and all(not x.strip() for x in between) else None
        follows = previous if previous and previous.lang in _COMMANDS else None
        found.append(
            Snippet(
                path,
                i + 1,
                lang,
                "\n".join(lines[i + 1 : end]),
                mark[1].split(":")[0] if mark else None,
                mark[2] if mark else None,
                follows,
            )
        )
        last_end = end
        i = end + 1
    return found


def _console_output(body: str) -> bool:
    continued = False
    for line in body.split("\n"):
        if line.startswith("$ ") or continued:
            continued = line.rstrip().endswith("\\")
            continue
        if line.strip():
            return True
    return False


def claims_output(snippet: Snippet) -> bool:
    if snippet.lang == "console":
        return _console_output(snippet.body)
    if snippet.lang == "python":
        return any(re.search(r"print\(.*\)\s+#\s*\S", line) for line in snippet.body.split("\n"))
    return snippet.follows is not None and snippet.lang in _OUTPUTS


def mark_of(snippet: Snippet) -> tuple[str | None, str | None]:
    """The mark that covers a snippet: its own, else (an output block) its command's."""
    if snippet.mark is None and snippet.follows is not None and snippet.lang in _OUTPUTS:
        return snippet.follows.mark, snippet.follows.tested_by
    return snippet.mark, snippet.tested_by
