"""Errors a producer can cause, each naming the field and the fix, and `PvmError`, the base of all PVM raises."""

from __future__ import annotations


class PvmError(Exception):
    """Base of every error PVM raises to its callers: contract, configuration, client, reader, store errors.

    `except pvm.PvmError` catches them all; each subclass also keeps the
    builtin base it had (ValueError, RuntimeError, ImportError), so code that
    caught those goes on working.
    """


class ContractError(PvmError, ValueError):
    """Base of every error raised for input that breaks the wire contract."""


class InvalidMinute(ContractError):
    """A minute field is missing, mistyped or out of range.

    `field` is the dotted path of the offending field (e.g. ``data.success_criteria_met``)
    so callers and dead-letter readers can tell exactly what to fix.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"invalid minute: {field}: {problem}")


class InvalidFact(ContractError):
    """A fact field is missing, mistyped or out of range, or the fact disagrees with itself.

    `field` names the offending field (e.g. ``confidence``, ``relationships[2].strength``,
    ``tier_key``) as `InvalidMinute` does for minutes.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"invalid fact: {field}: {problem}")
