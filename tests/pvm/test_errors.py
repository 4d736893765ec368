"""Every error PVM raises to its callers shares one base, `pvm.PvmError`, and keeps the builtin base it had."""

from __future__ import annotations

import pytest

import pvm
from contracts import ContractError, DecodeError, InvalidFact, InvalidMinute
from pvm.config import ConfigError, Settings
from pvm.connection import NoRedisConfigured, redis_from_settings
from pvm.embedders import EmbeddingConfigError, EmbeddingError
from pvm.extras import ServerExtraMissing
from pvm.llm import LLMConfigError, LLMError
from pvm.reader import ReaderError, SearchUnavailable, require_project
from pvm.stores.facts import FactStoreBusy
from pvm.stores.log import LogError
from pvm.vectors import ShardLockedError, VectorStoreError
from workers.api.auth import TokenFileError

# Each error with the builtin base code caught it by before PvmError existed.
KEPT_BASES: list[tuple[type[Exception], type[Exception]]] = [
    (ContractError, ValueError),
    (InvalidMinute, ValueError),
    (InvalidFact, ValueError),
    (DecodeError, ValueError),
    (ConfigError, ValueError),
    (TokenFileError, ValueError),
    (LLMConfigError, ValueError),
    (EmbeddingConfigError, ValueError),
    (ReaderError, ValueError),
    (SearchUnavailable, RuntimeError),
    (NoRedisConfigured, RuntimeError),
    (LogError, RuntimeError),
    (VectorStoreError, RuntimeError),
    (ShardLockedError, RuntimeError),
    (FactStoreBusy, RuntimeError),
    (ServerExtraMissing, ImportError),
    (LLMError, Exception),
    (EmbeddingError, Exception),
    (pvm.PVMAPIError, Exception),
    (pvm.PVMRequestError, Exception),
    (pvm.PVMServerError, Exception),
]


@pytest.mark.parametrize(("error", "kept"), KEPT_BASES, ids=[e.__name__ for e, _ in KEPT_BASES])
def test_every_error_is_a_pvm_error_and_keeps_its_builtin_base(error: type[Exception], kept: type[Exception]) -> None:
    assert issubclass(error, pvm.PvmError) and issubclass(error, kept)


def test_one_except_clause_catches_what_the_library_raises() -> None:
    raised: list[pvm.PvmError] = []
    for fail in (
        lambda: pvm.Minute(project_id="", event_type="message"),
        lambda: redis_from_settings(Settings()),
        lambda: pvm.Client("localhost:8080", ""),
        lambda: Settings.from_env({"PVM_SHARDS": "many"}),
        lambda: require_project(""),
    ):
        try:
            fail()
        except pvm.PvmError as exc:
            raised.append(exc)
    assert [type(e) for e in raised] == [InvalidMinute, NoRedisConfigured, ConfigError, ConfigError, ReaderError]
