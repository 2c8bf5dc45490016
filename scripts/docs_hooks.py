"""MkDocs hooks of the docs site (mkdocs.yml `hooks:`): links that leave docs/.

The pages link to files of the repository outside docs/ (`../chart/README.md`,
`../values-examples/l4-4x.yaml`, `../Dockerfile`), which read well on GitHub and in an
editor. MkDocs cannot serve them, so each such link becomes the file's address on GitHub
(`repo_url` + `/blob/main/...`, `/tree/main/...` for a folder), after checking that the
file exists: a link to a missing file is a warning, which fails `mkdocs build --strict` (the
"docs" step of scripts/test) as a broken link between pages does.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

__all__ = ["on_page_markdown"]

# Under mkdocs.plugins, so that --strict counts its warnings.
log = logging.getLogger("mkdocs.plugins.sie_docs_hooks")

# [text](target) and ![alt](target), outside code spans; targets without a scheme.
_LINK = re.compile(r"(\]\()([^)\s#:]+)(#[^)\s]*)?(\))")
_FENCE = re.compile(r"^(```|~~~)")


def _rewrite(line: str, page_dir: Path, docs: Path, root: Path, repo: str, where: str) -> str:
    def swap(match: re.Match[str]) -> str:
        target = (page_dir / match[2]).resolve()
        if target.is_relative_to(docs):
            return match[0]
        if not target.is_relative_to(root) or not target.exists():
            log.warning(f"{where}: link to {match[2]}: no such file in the repository")
            return match[0]
        kind = "tree" if target.is_dir() else "blob"
        address = f"{repo}/{kind}/main/{target.relative_to(root).as_posix()}"
        return f"{match[1]}{address}{match[3] or ''}{match[4]}"

    # Leave inline code alone: split on backticks, rewrite the even (outside) parts.
    parts = line.split("`")
    parts[::2] = [_LINK.sub(swap, part) for part in parts[::2]]
    return "`".join(parts)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    repo = str(config["repo_url"]).rstrip("/")
    source = docs / page.file.src_path
    out, fenced = [], False
    for line in markdown.split("\n"):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
        out.append(
            line if fenced else _rewrite(line, source.parent, docs, root, repo, page.file.src_path)
        )
    return "\n".join(out)
