"""docs/cli.md and docs/mcp.md show what the tool prints now: their generated parts are made again
here, by the real CLI and the real MCP server, and compared (ids, hashes, times aside)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gen_docs  # noqa: E402

STALE = "stale: python scripts/gen_docs.py --cli --mcp"


def committed_session() -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "cli.md").read_text()
    part = text.split("## A real session", 1)[1].split("## Every command", 1)[0]
    return re.findall(r"```console\n\$ ([^\n]*)\n(.*?)\n?```", part, re.S)


def test_the_cli_reference_lists_every_command_and_option():
    text = (ROOT / "docs" / "cli.md").read_text()
    assert text.split("## Every command\n\n", 1)[1].strip() == gen_docs.reference().strip(), STALE
    assert "`--isolation MODE`" in text and "`--best-of N`" in text


@pytest.mark.slow
def test_the_cli_session_shows_what_the_commands_print():
    committed = committed_session()
    fresh = gen_docs.session_blocks()
    assert [gen_docs.normalize(c) for c, _ in committed] == [gen_docs.normalize(c) for c, _, _ in fresh], STALE
    for (command, shown), (_, printed, checked) in zip(committed, fresh, strict=True):
        if checked:
            assert gen_docs.normalize(shown) == gen_docs.normalize(printed), f"{command}: {STALE}"


def test_the_mcp_tool_table_is_the_servers():
    text = (ROOT / "docs" / "mcp.md").read_text()
    assert gen_docs.generated(text, "tools") == gen_docs.mcp_tools_table(), STALE


@pytest.mark.slow
def test_the_mcp_exchange_shows_what_the_server_answers():
    text = (ROOT / "docs" / "mcp.md").read_text()
    assert gen_docs.normalize(gen_docs.generated(text, "exchange")) == \
        gen_docs.normalize(gen_docs.mcp_exchange()), STALE


@pytest.mark.slow
def test_the_orchestration_session_shows_what_the_commands_print():
    text = gen_docs.generated((ROOT / "docs" / "orchestration.md").read_text(), "session", flag="--orchestration")
    committed = re.findall(r"```console\n\$ ([^\n]*)\n(.*?)\n?```", text, re.S)
    fresh = gen_docs.session_blocks(gen_docs.ORCHESTRATION_SESSION)
    stale = "stale: python scripts/gen_docs.py --orchestration"
    assert [gen_docs.normalize(c) for c, _ in committed] == [gen_docs.normalize(c) for c, _, _ in fresh], stale
    for (command, shown), (_, printed, checked) in zip(committed, fresh, strict=True):
        if checked:
            assert gen_docs.normalize(shown) == gen_docs.normalize(printed), f"{command}: {stale}"


def test_the_readme_settings_table_is_the_table_of_settings():
    text = (ROOT / "README.md").read_text()
    assert gen_docs.generated(text, "settings", flag="") == gen_docs.settings_table(), \
        "stale: python scripts/gen_docs.py"


def test_the_man_page_and_the_readme_name_every_setting_the_code_reads():
    from subtask.model.config import SETTINGS

    page = (ROOT / "man" / "git-subtask.1").read_text().replace("\\-", "-")
    page = page.split(".SH SETTINGS", 1)[1].split(".SH ", 1)[0]
    readme = (ROOT / "README.md").read_text().split("## Settings", 1)[1].split("\n## ", 1)[0]
    for key in SETTINGS:
        assert f"\\fBsubtask.{key}\\fR" in page, f"man page: subtask.{key}"
        assert f"| `subtask.{key}` |" in readme, f"README: subtask.{key}"
