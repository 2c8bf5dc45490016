"""The release version: VERSION is the one source; this writes it everywhere else.

Places that carry a copy (each rewritten in place, nothing else on the line changes):
    worker/src/sie_worker/_version.py   __version__ (hatch reads it for the package version)
    chart/Chart.yaml                    version and appVersion (the image tag, see README)

Usage:
    version.py            print the version; exit 1, naming each place, when a copy differs
    version.py --sync     write VERSION into every place
    version.py --set X    write X into VERSION, then --sync
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PLACES", "Place", "check", "main", "read_version", "sync"]

_SEMVER = re.compile(r"^\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Place:
    """One copy of the version: a file and the line pattern holding it."""

    path: str  # relative to the repo root
    pattern: str  # groups: (before)(version)(after)
    label: str

    def read(self, root: Path) -> str | None:
        match = re.search(self.pattern, (root / self.path).read_text(), re.MULTILINE)
        return match.group(2) if match else None

    def write(self, root: Path, version: str) -> None:
        path = root / self.path
        text, count = re.subn(
            self.pattern,
            lambda m: m.group(1) + version + m.group(3),
            path.read_text(),
            count=1,
            flags=re.MULTILINE,
        )
        if count != 1:
            raise ValueError(f"{self.path}: no {self.label} line to update")
        path.write_text(text)


PLACES = (
    Place("worker/src/sie_worker/_version.py", r'^(__version__ = ")([^"]*)(")', "__version__"),
    Place("chart/Chart.yaml", r"^(version:[ \t]*)([^\s#]+)()", "version"),
    Place("chart/Chart.yaml", r'^(appVersion:[ \t]*"?)([^"\s#]+)("?)', "appVersion"),
)


def read_version(root: Path = ROOT) -> str:
    version = (root / "VERSION").read_text().strip()
    if not _SEMVER.match(version):
        raise ValueError(f"VERSION: {version!r} is not a semantic version like 1.2.3")
    return version


def check(root: Path = ROOT) -> list[str]:
    """One line per place whose copy differs from VERSION (or is missing)."""
    version = read_version(root)
    problems = []
    for place in PLACES:
        if not (root / place.path).is_file():
            problems.append(f"{place.path}: missing (expected {place.label} {version})")
            continue
        found = place.read(root)
        if found != version:
            problems.append(
                f"{place.path}: {place.label} is {found!r}, VERSION is {version!r}; "
                "run `make version`"
            )
    return problems


def sync(root: Path = ROOT, version: str | None = None) -> str:
    """Write `version` (default: VERSION's) into VERSION and every place; returns it."""
    version = version or read_version(root)
    if not _SEMVER.match(version):
        raise ValueError(f"{version!r} is not a semantic version like 1.2.3")
    (root / "VERSION").write_text(version + "\n")
    for place in PLACES:
        place.write(root, version)
    return version


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--sync", action="store_true", help="write VERSION everywhere")
    group.add_argument("--set", metavar="X.Y.Z", help="set VERSION, then write it everywhere")
    args = parser.parse_args(argv)
    try:
        if args.sync or args.set:
            print(f"version: {sync(ROOT, args.set)} written to VERSION and {len(PLACES)} places")
            return 0
        problems = check(ROOT)
    except ValueError as exc:
        print(f"version: {exc}", file=sys.stderr)
        return 1
    for problem in problems:
        print(problem, file=sys.stderr)
    print(read_version(ROOT))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
