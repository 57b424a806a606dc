"""What labkit's command lines share: argparse ``type=`` checks and a parser that fails in one line.

Every CLI (``python -m labkit.bench``, the recipes under :mod:`labkit.recipes`) rejects a bad value while
parsing, before it starts anything: exit status 2 and one line on stderr, ``prog: error: ...``, never a
traceback from deep inside and never a value silently ignored. The ``type=`` functions take the flag's
text and return the parsed value, or raise :class:`BadValue` saying what was expected.

Not a public module (not in ``labkit.__all__``): its users are the command lines.
Introduced in notebook 04.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from typing import NoReturn

from labkit._validate import safe_repr

__all__ = ["PG_TIMEOUT_MAX_S", "ArgumentParser", "BadValue", "choices_list", "device", "float_in", "int_in", "int_list",
           "launch_world", "pg_timeout"]

#: The longest process-group timeout a command line takes (a week): a typo cannot overflow a timedelta.
PG_TIMEOUT_MAX_S = 7 * 24 * 3600.0


class BadValue(argparse.ArgumentTypeError, ValueError):
    """A flag's value is not what the flag takes; argparse shows the message. Introduced in notebook 04."""


class ArgumentParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose errors are one line on stderr (then exit status 2).

    ``checks`` run after parsing, on the whole namespace, for rules that tie flags together; each raises
    ``ValueError`` (or ``TypeError``) with the message to show. Subparsers made with ``add_subparsers``
    are of this class too.
    Introduced in notebook 04.
    """

    def __init__(self, *args: object, checks: Sequence[Callable[[argparse.Namespace], None]] = (),
                 **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.checks = list(checks)

    def error(self, message: str) -> NoReturn:
        line = " ".join(f"{self.prog}: error: {message} (see --help)".split())
        self.exit(2, line + "\n")

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        ns, rest = super().parse_known_args(args, namespace)
        for check in self.checks:
            try:
                check(ns)
            except (TypeError, ValueError) as exc:
                self.error(str(exc))
        return ns, rest


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"a flag's value is text, got {type(value).__name__}")
    return value.strip()


def int_in(low: int, high: int | None = None) -> Callable[[str], int]:
    """Return a ``type=`` function for a whole number ``>= low`` (and ``<= high`` if given).

    Introduced in notebook 04.
    """
    want = f"a whole number >= {low}" + (f" and <= {high}" if high is not None else "")

    def parse(text: str) -> int:
        try:
            value = int(_text(text))
        except ValueError:
            raise BadValue(f"expected {want}, got {safe_repr(text)}") from None
        if value < low or (high is not None and value > high):
            raise BadValue(f"expected {want}, got {value}")
        return value

    parse.__name__ = "whole number"
    return parse


def float_in(low: float = -math.inf, high: float = math.inf, *, low_open: bool = False) -> Callable[[str], float]:
    """Return a ``type=`` function for a finite number in ``[low, high]`` (``(low, high]`` with ``low_open``).

    ``inf`` and ``nan`` are always rejected. Introduced in notebook 04.
    """
    bounds = f"{'>' if low_open else '>='} {low:.15g}" if math.isfinite(low) else ""
    if math.isfinite(high):
        bounds += (" and " if bounds else "") + f"<= {high:.15g}"
    want = "a finite number" + (f" {bounds}" if bounds else "")

    def parse(text: str) -> float:
        try:
            value = float(_text(text))
        except ValueError:
            raise BadValue(f"expected {want}, got {safe_repr(text)}") from None
        if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
            raise BadValue(f"expected {want}, got {text.strip()}")
        return value

    parse.__name__ = "number"
    return parse


def int_list(low: int = 1, high: int | None = None) -> Callable[[str], str]:
    """Return a ``type=`` function for comma-separated whole numbers ``>= low`` (``<= high``); returns the text.

    Introduced in notebook 04.
    """
    one = int_in(low, high)

    def parse(text: str) -> str:
        items = [s for s in _text(text).split(",") if s.strip()]
        if not items:
            raise BadValue(f"expected comma-separated whole numbers >= {low}, got {safe_repr(text)}")
        for item in items:
            one(item)
        return text

    parse.__name__ = "list"
    return parse


def choices_list(allowed: Sequence[str]) -> Callable[[str], str]:
    """Return a ``type=`` function for a comma-separated list of names from ``allowed``; returns the text.

    Introduced in notebook 04.
    """
    def parse(text: str) -> str:
        names = [s.strip() for s in _text(text).split(",") if s.strip()]
        bad = [n for n in names if n not in allowed]
        if not names or bad:
            raise BadValue(f"expected comma-separated names from {', '.join(allowed)}, got {safe_repr(text)}")
        return text

    parse.__name__ = "list"
    return parse


def device(text: str) -> str:
    """``type=`` for ``--device``: a device this machine has (see :func:`labkit.device.pick_device`).

    Introduced in notebook 04.
    """
    from labkit import device as dev_gate

    try:
        dev_gate.pick_device(_text(text))
    except (TypeError, ValueError, RuntimeError) as exc:  # torch.device("nonsense") raises RuntimeError
        raise BadValue(f"expected cpu, cuda, cuda:N or mps that this machine has: {exc}") from None
    return text.strip()


def pg_timeout(text: str) -> float:
    """``type=`` for ``--pg-timeout``: seconds, a finite number > 0 and at most a week.

    Introduced in notebook 09.
    """
    return float_in(0.0, PG_TIMEOUT_MAX_S, low_open=True)(text)


def launcher_env(_args: argparse.Namespace | None = None) -> None:
    """A parser check: raise ValueError (one line, exit status 2) if torchrun's or srun's variables are
    inconsistent (RANK without WORLD_SIZE, RANK=5 WORLD_SIZE=2, MASTER_PORT=99999), before any work starts.
    Introduced in notebook 09.
    """
    from labkit import dist as ldist

    ldist.rank_env()


def device_env(_args: argparse.Namespace | None = None) -> None:
    """A parser check: raise ValueError (one line, exit status 2) if $LABKIT_DEVICE names no device this machine
    has ("bogus", "cuda" without a GPU), before any work starts. Introduced in notebook 00.
    """
    import os

    if os.environ.get("LABKIT_DEVICE"):
        from labkit import device as dev_gate

        try:
            dev_gate.pick_device()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"LABKIT_DEVICE={safe_repr(os.environ['LABKIT_DEVICE'])}: {exc}") from None


def launch_world() -> int | None:
    """The world size this process was launched with (torchrun's or srun's variables; 1 alone), or None.

    None when the launcher's variables are inconsistent: the recipe reports that when it starts.
    Introduced in notebook 09.
    """
    from labkit import dist as ldist

    try:
        return ldist.rank_env().world_size
    except ValueError:
        return None
