"""Commands that cannot rot: every `ssfl ...` command of README.md's and docs/'s code blocks is
parsed by the CLI's own parser, and its experiment resolved by the config loader (the file
exists, every --set key is known and its value allowed; a sweep's every grid value; a
reproduce command's table, dataset, rows and columns); a command the block shows refused
(its next line `ssfl: error: ...`) must be refused with that line. Inline `ssfl ...` code
in the prose names a command without all its arguments: its experiment file must exist and
its --set keys be known (its values may be the bad ones a page discusses)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, replace
from itertools import pairwise
from pathlib import Path

import pytest

from ssfl.cli import build_parser, main
from ssfl.experiment import resolve_experiment
from ssfl.registry import settings_of
from tasks.config import ConfigError
from tests.conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^\s*```")
INLINE = re.compile(r"`(ssfl [^`]+)`")
# A stand-in the reader replaces (DIR, OUT, EXP, MODE, <name>, ...): such a command is parsed
# only where the stand-in is --out's value; elsewhere it is not checked.
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*(\.yaml)?$|=[A-Z]$|<|>|\.\.\.|^\$|^\{|^\[")


@dataclass(frozen=True)
class DocCommand:
    where: str  # file:line
    text: str
    inline: bool = False  # inline code in the prose: a mention, not a whole command
    elsewhere: bool = False  # after a `cd` in its block: its files are not the repository's
    refused: str = ""  # the `ssfl: error: ...` line the block shows after it

    def argv(self) -> list[str]:
        """The arguments after `ssfl`, as a shell splits them ([] when it cannot: unbalanced
        quotes, which the test reports)."""
        try:
            return shlex.split(self.text, comments=True)[1:]
        except ValueError:
            return []


def doc_commands(path: Path) -> list[DocCommand]:
    """The `ssfl` lines of the file's code blocks (a trailing backslash joins the next line)
    and its inline `ssfl ...` code with at least an argument."""
    out: list[DocCommand] = []
    inside, pending, start, moved = False, "", 0, False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            inside, pending, start, moved = not inside, "", 0, False
            continue
        text = line.strip()
        if (
            inside
            and text.startswith("ssfl: error: ")
            and out
            and out[-1].where.endswith(f":{number - 1}")
        ):
            out[-1] = replace(out[-1], refused=text)
        elif inside and (pending or re.match(r"^(\$ )?ssfl ", text)):
            start = start or number
            pending = f"{pending} {text.removesuffix(chr(92)).strip()}".strip()
            if not text.endswith("\\"):
                where = f"{path.relative_to(ROOT)}:{start}"
                out.append(DocCommand(where, re.sub(r"^\$ ", "", pending), elsewhere=moved))
                pending, start = "", 0
        elif inside:
            moved = moved or text.startswith("cd ")
        else:
            where = f"{path.relative_to(ROOT)}:{number}"
            out += [DocCommand(where, m.group(1), inline=True) for m in INLINE.finditer(line)]
    return [c for c in out if len(c.argv()) != 1 and c.argv()[:1] != ["--version"]]


COMMANDS = [c for path in DOCS for c in doc_commands(path)]
SUBCOMMANDS = {
    "run",
    "deploy-local",
    "compare",
    "reproduce",
    "sweep",
    "evaluate",
    "sanity",
    "validate",
}


def placeholders(argv: list[str]) -> bool:
    """Whether a token other than --out's value stands in for the reader's own."""
    return any(
        PLACEHOLDER.search(token) and not (i and argv[i - 1] == "--out")
        for i, token in enumerate(argv)
    )


def check_mention(command: DocCommand) -> None:
    """An inline command's experiment file exists and its --set values resolve against it."""
    argv = command.argv()
    experiments = [t for t in argv if t.endswith(".yaml") and not PLACEHOLDER.search(t)]
    sets = [v for k, v in pairwise(argv) if k == "--set" and not PLACEHOLDER.search(v)]
    for experiment in experiments:
        try:
            settings_of(resolve_experiment(experiment, None, None, sets))
        except ConfigError as err:
            assert "unknown config key" not in str(err) and "not found" not in str(err), err


def test_the_docs_hold_the_commands_this_test_checks():
    # 140: the reference's synopsis is generated usage now, whose lines are not commands
    assert len(COMMANDS) >= 140
    assert {c.argv()[0] for c in COMMANDS if c.argv()} >= {"run", "reproduce", "sweep"}
    parser_commands = build_parser()._subparsers._group_actions[0].choices
    assert set(parser_commands) == SUBCOMMANDS


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.where)
def test_a_documented_command_parses_and_its_experiment_resolves(command, tmp_path, capsys):
    argv = command.argv()
    if not argv and "<" in command.text:  # a synopsis with prose in its stand-ins
        return
    assert argv, f"{command.where}: `{command.text}`: the shell cannot split it"
    if command.inline:
        check_mention(command)
        return
    if command.refused:
        argv = [t for t in argv if t != "..."]  # the page's elision of the rest
        with pytest.raises(ConfigError) as refused:
            resolve_and_check(build_parser().parse_args(argv), argv, tmp_path, capsys)
        assert command.refused == f"ssfl: error: {refused.value}", command.where
        return
    if placeholders(argv) or command.elsewhere:  # what the reader fills in is not checked
        assert argv[0] in SUBCOMMANDS, f"{command.where}: no command `ssfl {argv[0]}`"
        if not command.elsewhere:
            check_mention(command)
        return
    try:
        args = build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"{command.where}: `{command.text}` does not parse: {capsys.readouterr().err}")
    resolve_and_check(args, argv, tmp_path, capsys)


def resolve_and_check(args, argv: list[str], tmp_path: Path, capsys) -> None:
    """Resolve what the parsed command names: its experiment with every override (each grid
    value of a sweep, a+b tying keys), the validated files, a reproduce table's cells."""
    name = argv[0]
    if name in ("run", "deploy-local"):
        settings_of(resolve_experiment(args.experiment, args.rounds, args.nodes, args.set or []))
    elif name == "sweep":
        for grid in args.set_grid:
            keys, values = grid.split("=", 1)
            for value in values.split(","):
                tied = [f"{key}={value}" for key in keys.split("+")]
                sets = [*(args.set or []), *tied]
                settings_of(resolve_experiment(args.experiment, args.rounds, None, sets))
    elif name == "validate":
        assert all(list(ROOT.glob(pattern)) for pattern in args.experiments), argv
    elif name == "reproduce":
        kept = [t for t in argv if t not in ("--resume", "--overwrite")]
        i = kept.index("--out")
        cells = ["--out", str(tmp_path / "cells")]
        assert main([*kept[:i], *cells, *kept[i + 2 :], "--no-run"]) == 0, capsys.readouterr().err
