"""Where the ``lethe`` command line's settings come from, in order of precedence.

The command line, the environment, a config file, the built-in defaults — in
that order (docs/operating.md, "The command line for scripts").

One naming rule ties the three together. A long flag ``--kek-file`` is

- the environment variable ``LETHE_KEK_FILE`` (``LETHE_`` + the flag in upper
  case, ``-`` → ``_``);
- the config-file key ``kek_file`` (the flag, ``-`` → ``_``), at the top level
  of the file (every command that has the flag) or in the table of one
  command (``[serve]``, ``[token]``, …), which beats the top level.

The config file is TOML (read with the stdlib's :mod:`tomllib`), named by
``--config PATH`` anywhere on the command line or by ``LETHE_CONFIG``; there is
no implicit one. An empty environment variable counts as unset. A switch
(``--json``) takes ``1/true/yes/on`` or ``0/false/no/off`` from the
environment and a TOML boolean from the file. Values are checked as the flag
checks them; a bad one fails with :class:`SettingsError` naming the variable
or the file and key, and a key no command knows is refused by name. The flags
in :data:`COMMAND_LINE_ONLY` (who a new token acts for) are taken from the
command line alone: a stray ``LETHE_ADMIN`` must not mint admin tokens.

Applied by setting each flag's argparse default (a string, which argparse
converts as if typed), so ``--help`` shows the value in force.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "COMMAND_LINE_ONLY",
    "CONFIG_ENV",
    "SettingsError",
    "apply_settings",
    "config_key",
    "env_name",
    "leaf_parsers",
]

CONFIG_ENV = "LETHE_CONFIG"
"""The environment variable naming the config file (``--config`` beats it)."""
COMMAND_LINE_ONLY = frozenset(
    {"--owner@token create", "--admin@token create", "--sample@demo", "--owner@audit"}
)
"""``flag@command`` pairs never taken from the environment or a config file:
who a new token acts for, the owners ``lethe audit --target`` audits (a
repeated flag), and the one of two exclusive flags (``--sample``,
``--locomo``) whose layer could not otherwise lose to the other's."""
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_SKIP = frozenset({"--help", "--config"})


class SettingsError(Exception):
    """A bad environment variable, config file or config key (exit status 2).

    The message names the variable, or the file and the key.
    """


def env_name(flag: str) -> str:
    """``--kek-file`` → ``LETHE_KEK_FILE``."""
    return "LETHE_" + flag.lstrip("-").replace("-", "_").upper()


def config_key(flag: str) -> str:
    """``--kek-file`` → ``kek_file``."""
    return flag.lstrip("-").replace("-", "_")


def leaf_parsers(
    parser: argparse.ArgumentParser, prefix: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every command's own parser, by its name (``serve``, ``token create``, …).

    Args:
        parser: the top-level parser; sub-commands are found through its
            sub-parsers action.
        prefix: the command words above ``parser`` (for recursion).
    """
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix.strip(), parser
        return
    for sub in subs:
        for name, child in sub.choices.items():
            yield from leaf_parsers(child, f"{prefix} {name}")


def _long_flag(action: argparse.Action) -> str | None:
    longs = [s for s in action.option_strings if s.startswith("--")]
    return longs[0] if longs else None


def _settable(command: str, parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The flags of ``command`` that the environment and config file may set."""
    out: dict[str, argparse.Action] = {}
    for action in parser._actions:
        flag = _long_flag(action)
        if flag is None or flag in _SKIP or f"{flag}@{command}" in COMMAND_LINE_ONLY:
            continue
        out[flag] = action
    return out


def _config_path(argv: Sequence[str], environ: Mapping[str, str]) -> Path | None:
    """``--config PATH`` (or ``--config=PATH``) from ``argv``, else ``LETHE_CONFIG``."""
    for i, word in enumerate(argv):
        if word == "--":
            break
        if word == "--config" and i + 1 < len(argv):
            return Path(argv[i + 1])
        if word.startswith("--config="):
            return Path(word.split("=", 1)[1])
    value = environ.get(CONFIG_ENV, "")
    return Path(value) if value else None


def _load(path: Path) -> dict[str, Any]:
    """The parsed TOML file.

    Raises:
        SettingsError: it cannot be read or is not TOML (naming ``path``).
    """
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise SettingsError(f"config file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path} is not TOML: {exc}") from None


def _check_keys(
    path: Path, body: dict[str, Any], commands: dict[str, dict[str, argparse.Action]]
) -> None:
    """Refuse a key or table no command knows.

    Raises:
        SettingsError: naming the file and the key.
    """
    tops = {c.split()[0] for c in commands}
    everywhere = {config_key(f) for flags in commands.values() for f in flags}

    def unknown(where: str, key: str, known: set[str]) -> SettingsError:
        spelled = key.replace("-", "_")
        hint = f" (did you mean {spelled!r}?)" if spelled in known else ""
        return SettingsError(
            f"config file {path}: unknown key {key!r}{where}{hint}; "
            f"known: {', '.join(sorted(known))}"
        )

    for key, value in body.items():
        if isinstance(value, dict):
            if key not in tops:
                raise SettingsError(
                    f"config file {path}: unknown table [{key}]; tables are the commands: "
                    + ", ".join(sorted(tops))
                )
            known = {
                config_key(f) for c, flags in commands.items() if c.split()[0] == key for f in flags
            }
            for sub in value:
                if sub not in known:
                    raise unknown(f" in [{key}]", sub, known)
        elif key not in everywhere:
            raise unknown("", key, everywhere)


def _text(action: argparse.Action, value: Any, source: str) -> str | bool:
    """A config or environment value as argparse would take it.

    Returns a string for a flag with a value, a bool for a switch.

    Raises:
        SettingsError: the wrong kind of value, or one the flag's check refuses.
    """
    switch = action.nargs == 0
    if switch:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        raise SettingsError(f"{source}: expected true or false, got {value!r}")
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise SettingsError(f"{source}: expected a string or a number, got {value!r}")
    text = str(value)
    try:
        converted = action.type(text) if callable(action.type) else text
    except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
        raise SettingsError(f"{source}: {exc}") from None
    if action.choices is not None and converted not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise SettingsError(f"{source}: {text!r} is not one of {choices}")
    return text


def apply_settings(
    parser: argparse.ArgumentParser, argv: Sequence[str], environ: Mapping[str, str]
) -> Path | None:
    """Make the environment and the config file the defaults of ``parser``'s flags.

    After this, ``parser.parse_args(argv)`` gives command line > environment >
    config-file table of the command > config-file top level > built-in default.
    A flag that is required loses ``required`` once a layer supplies it. Only
    the flags of the command ``argv`` runs are read from the environment (a
    bad ``LETHE_WORKERS`` stops ``lethe serve``, not ``lethe audit``); the
    config file's keys are all checked, whatever the command.

    Args:
        parser: the top-level ``lethe`` parser.
        argv: the command line (without the program name), read for ``--config``.
        environ: the environment (``os.environ``).

    Returns:
        The config file read, or None.

    Raises:
        SettingsError: a bad value (naming the variable, or the file and key),
            an unknown key or table, or a config file that cannot be read.
    """
    commands = {name: _settable(name, sub) for name, sub in leaf_parsers(parser)}
    path = _config_path(argv, environ)
    body = _load(path) if path is not None else {}
    if path is not None:
        _check_keys(path, body, commands)
    name = _invoked(argv, commands)
    if name is not None:
        table = body.get(name.split()[0], {})
        for flag, action in commands[name].items():
            key, var = config_key(flag), env_name(flag)
            if environ.get(var, ""):
                value: Any = environ[var]
                source = f"environment variable {var}"
            elif key in table:
                value, source = table[key], f"config file {path}: [{name.split()[0]}] {key}"
            elif key in body and not isinstance(body[key], dict):
                value, source = body[key], f"config file {path}: {key}"
            else:
                continue
            action.default = _text(action, value, source)
            action.required = False
    return path


def _invoked(argv: Sequence[str], commands: Mapping[str, object]) -> str | None:
    """The command ``argv`` runs (``serve``, ``token create``, …), or None when it names none.

    When it names none, argparse reports the usage error. The top-level parser and
    ``token`` take no option but ``--help`` before the command word, so the
    command is the first word, or the first two.
    """
    for length in (2, 1):
        name = " ".join(argv[:length])
        if len(argv) >= length and name in commands:
            return name
    return None
