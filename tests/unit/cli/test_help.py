"""Every option with a default says it in `--help` (all commands, nested actions too)."""

from __future__ import annotations

import argparse

import pytest

from runwatch.cli import build_parser


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    out = []

    def walk(name: str, parser: argparse.ArgumentParser) -> None:
        out.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child_name, child in action.choices.items():
                    walk(f"{name} {child_name}".strip(), child)

    walk("", build_parser())
    return out


PARSERS = _parsers()


def _shown(action: argparse.Action) -> bool:
    return not (
        action.default in (None, argparse.SUPPRESS, [], "")
        or action.nargs == 0
        or isinstance(action, argparse._SubParsersAction)
    )


def _entry(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The help text `--help` prints for one option, whitespace collapsed."""
    formatter = parser._get_formatter()
    formatter.add_argument(action)
    return " ".join(formatter.format_help().split())


@pytest.mark.parametrize(("name", "parser"), PARSERS, ids=[n or "runwatch" for n, _ in PARSERS])
def test_help_shows_every_default(name: str, parser: argparse.ArgumentParser) -> None:
    missing = [
        max(action.option_strings or [action.dest], key=len)
        for action in parser._actions
        if _shown(action) and "default" not in _entry(parser, action)
    ]
    assert not missing, f"runwatch {name} --help shows no default for {missing}"
    assert "(default: " in " ".join(parser.format_help().split()) or not any(
        _shown(a) for a in parser._actions
    )


def test_the_parser_itself_is_not_changed_by_formatting() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    audit = sub.choices["audit"]
    timeout = next(a for a in audit._actions if "--timeout" in a.option_strings)
    before = timeout.help
    audit.format_help()
    assert timeout.help == before
