"""The commands that run without click (subtask/faces/commands) read a command line as click
does, or leave it to click: the registry's parser and the click command built from the same
declaration give the same values, and whatever the parser is not sure of, click answers."""

from __future__ import annotations

import click
import pytest

from subtask.faces import commands
from subtask.faces.cli import cli

SURE = [
    ["list"], ["list", "--json"], ["list", "--state", "running", "-n", "3"], ["list", "--limit=7", "--all"],
    ["status"], ["status", "st-1234", "--json"],
    ["show", "st-1234"], ["show", "--log", "st-1234", "--json"],
    ["result", "st-1234", "--full"], ["result", "--evidence", "st-1234"], ["result", "st-1234", "--json"],
    ["wait", "st-1", "st-2"], ["wait", "--any", "--timeout", "2.5", "st-1"], ["wait", "st-1", "--timeout=3"],
    ["wait", "--", "st-1"],
    ["cleanup", "st-1"], ["cleanup", "--merged", "-q"], ["cleanup", "-n", "--json", "st-1"],
    ["start", "echo hi"], ["start", "-", "--json"], ["start", "--engine", "shell", "-b", "main", "true"],
    ["start", "--verify", "pytest -q", "--check", "no-suppression", "--check", "paths=src/**", "x"],
    ["start", "--best-of", "3", "--pick", "fastest", "--engine", "a,b", "x"],
    ["start", "--after", "st-1", "--after", "st-2", "--on-fail", "run", "x"],
    ["start", "--readonly", "--isolation", "none", "--max-usd", "1.5", "--timeout", "60", "x"],
    ["start", "--", "--not-an-option"],
]
UNSURE = [
    ["list", "-h"], ["list", "--help"], ["list", "--bogus"], ["list", "--limit", "0"], ["list", "-n5"],
    ["list", "--json=yes"], ["list", "extra"], ["show"], ["show", "a", "b"], ["wait"],
    ["wait", "--timeout", "soon", "x"], ["wait", "--timeout"], ["start"], ["start", "--pick", "best", "x"],
    ["start", "--best-of", "two", "x"], ["cleanup", "-qn"], ["result", "-x", "st-1"],
]


def click_values(argv: list[str]) -> dict:
    command = cli.get_command(click.Context(cli), argv[0])
    with command.make_context(argv[0], list(argv[1:])) as ctx:
        return dict(ctx.params)


@pytest.mark.parametrize("argv", SURE, ids=[" ".join(a) for a in SURE])
def test_the_registry_reads_a_command_line_as_click_does(argv):
    found = commands.find(argv)
    assert found is not None, f"{argv}: left to click"
    command, values = found
    assert command.name == argv[0]
    assert values == click_values(argv)


@pytest.mark.parametrize("argv", UNSURE, ids=[" ".join(a) for a in UNSURE])
def test_what_the_registry_is_not_sure_of_is_left_to_click(argv):
    assert commands.find(argv) is None


@pytest.mark.parametrize("argv, code", [(["list", "--bogus"], 129), (["list", "--limit", "0"], 129),
                                        (["wait"], 129), (["show", "a", "b"], 129), (["list", "-h"], 0)])
def test_click_answers_what_the_registry_leaves_to_it(cli, argv, code):
    proc = cli(*argv)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    assert ("Usage: git subtask" in (proc.stdout + proc.stderr))


def test_every_registry_command_is_a_click_command_with_its_words():
    for name, command in commands.COMMANDS.items():
        built = cli.get_command(click.Context(cli), name)
        assert built is not None and built.help == command.help
        assert [p.name for p in built.params] == [p.name for p in command.params]
