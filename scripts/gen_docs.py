"""Regenerate the manual page and its HTML from the click commands: python scripts/gen_docs.py"""

from __future__ import annotations

from pathlib import Path

from subtask.cli import cli
from subtask.manpage import roff, to_html

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    (ROOT / "man").mkdir(exist_ok=True)
    (ROOT / "man" / "git-subtask.1").write_text(roff(cli))
    (ROOT / "man" / "git-subtask.html").write_text(to_html(cli))
    print("wrote man/git-subtask.1 and man/git-subtask.html")


if __name__ == "__main__":
    main()
