"""A small reader of the repo's Dockerfile for the image tests: stages and their instructions.

It understands what the Dockerfile uses (line continuations, comments, global ARGs with
defaults, `FROM image AS name`), not the whole Dockerfile grammar.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Instruction", "Stage", "dockerignored", "parse_dockerfile", "read_dockerignore"]


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    args: str  # the rest of the logical line, continuations joined with spaces


@dataclass
class Stage:
    name: str
    base: str  # image reference after global ARG substitution, or a stage name
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [i.args for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        """ENV settings of this stage (`K=V` forms)."""
        out: dict[str, str] = {}
        for args in self.all("ENV"):
            for word in shlex.split(args):
                key, sep, value = word.partition("=")
                if sep:
                    out[key] = value
        return out

    def labels(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for args in self.all("LABEL"):
            for word in shlex.split(args):
                key, _, value = word.partition("=")
                out[key] = value
        return out


def _logical_lines(text: str) -> list[str]:
    lines: list[str] = []
    current = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if current and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if stripped.endswith("\\"):
            current += stripped[:-1].strip() + " "
            continue
        lines.append((current + stripped).strip())
        current = ""
    if current:
        lines.append(current.strip())
    return lines


def parse_dockerfile(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, in order."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in _logical_lines(path.read_text()):
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = args.split()
            base = re.sub(
                r"\$\{(\w+)\}", lambda m: global_args.get(m.group(1), m.group(0)), words[0]
            )
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(name=name, base=base))
        elif keyword == "ARG" and not stages:
            key, _, value = args.partition("=")
            global_args[key.strip()] = value.strip()
        elif stages:
            stages[-1].instructions.append(Instruction(keyword, args))
    return global_args, stages


def read_dockerignore(path: Path) -> list[str]:
    return [
        line.strip()
        for line in path.read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    # Docker's matcher: `**` spans folders, `*` and `?` stay inside one path element.
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out += pattern[i : end + 1]
            i = end + 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + "$")


def dockerignored(patterns: list[str], rel_path: str) -> bool:
    """Whether the build context leaves out `rel_path`: the last matching pattern decides,
    and a pattern that matches a parent folder matches everything below it."""
    parts = rel_path.strip("/").split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw[1:] if negate else raw
        regex = _pattern_regex(pattern.strip("/"))
        if any(regex.match(c) for c in candidates):
            ignored = not negate
    return ignored
