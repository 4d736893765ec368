"""Settings: one declaration per variable, from which parsing, `to_env()`, the errors and the reference derive."""

from __future__ import annotations

import dataclasses
import io
import math
import string
import tokenize
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import pvm.config
from contracts import keys
from pvm import defaults
from pvm.config import DEFINITIONS, ConfigError, Settings, settings_reference

ROOT = Path(__file__).resolve().parents[2]

# Values each variable must refuse. Every variable that is not free text (a name, a key, a path) is here.
BAD_VALUES: dict[str, list[str]] = {
    "PVM_REDIS_URL": ["localhost:6379", "http://127.0.0.1:6379/0", "redis//host"],
    "PVM_SHARDS": ["zero", "0", "-1", "1.5", "4 shards"],
    "PVM_DOWNSTREAM": ["nosuchpool", "log", "index,nosuch"],
    "PVM_RECENT_WINDOW": ["0", "many"],
    "PVM_MINUTE_CACHE_SIZE": ["0", "1e3"],
    "PVM_DISPATCH_BATCH": ["0", "x"],
    "PVM_FANOUT_BATCH": ["0", "-5", "many"],
    "PVM_CLAIM_IDLE_MS": ["0", "30s"],
    "PVM_MAX_DELIVERIES": ["0", "five"],
    "PVM_JOB_TIMEOUT": ["0", "2m"],
    "PVM_QDRANT_URL": ["qdrant:6333", "grpc://qdrant:6334"],
    "OPENAI_BASE_URL": ["api.openai.com/v1", "ftp://example.com"],
    "PVM_EMBED_DIMENSIONS": ["0", "-5", "auto"],
    "PVM_EMBED_BATCH_SIZE": ["0", "2049", "4096", "lots"],
    "PVM_EMBED_MAX_RETRIES": ["-1", "x"],
    "PVM_EMBED_TIMEOUT": ["0", "0.05", "nan", "inf", "-1", "30s"],
    "PVM_EMBED_QUERY_TIMEOUT": ["0.01", "nan", "x"],
    "PVM_SEARCH_WEIGHTS": ["1,2,3", "0,0,0,0", "-1,1,1,1", "a,b,c,d", "nan,1,1,1", "1,2,3,4,5"],
    "PVM_API_URL": ["127.0.0.1:8080", "ws://127.0.0.1:8080"],
    "PVM_OPTIMIZE_EVERY": ["-1", "hourly"],
    "PVM_SEARCH_HOT_MINUTES": ["-1", "25k"],
    "PVM_EXTRA_JOB_FUNCTIONS": ["os", "os.*", "os.system(1)", "pkg..f"],
    "PVM_REDIS_START_WAIT": ["-1", "nan", "inf", "forever"],
    "PVM_LLM_BASE_URL": ["localhost:11434/v1", "ftp://example.com"],
    "PVM_LLM_TIMEOUT": ["0", "0.05", "nan", "60s"],
    "PVM_LLM_MAX_RETRIES": ["-1", "x"],
    "PVM_LLM_MAX_TOKENS": ["0", "lots"],
    "PVM_LLM_TEMPERATURE": ["-0.1", "2.5", "nan", "hot"],
    "PVM_FACT_PROMOTE_AT": ["-0.1", "1.5", "nan", "high"],
    "PVM_FACT_STATEMENTS": ["on", "yes", "none"],
    "PVM_FACT_TIER_SPLIT": ["40,40", "0,0,0", "-1,1,1", "a,b,c", "inf,1,1", "40,40,10,10"],
    "PVM_EVALUATE_EVERY": ["-1", "daily"],
    "PVM_EVALUATE_SLICE": ["0", "many"],
    "PVM_SCORE_WEIGHTS": ["1,1,1", "0,0,0,0", "-1,1,1,1", "a,b,c,d"],
    "PVM_PRUNE_BELOW": ["-0.1", "1.5", "low"],
    "PVM_PRUNE_GRACE": ["-1", "a week"],
    "PVM_DEDUPE_AT": ["1.1", "-1", "close"],
    "PVM_FACT_DEDUPE_AT": ["1.5", "-0.1", "nan", "near"],
    "PVM_THREAD_BY": ["agent", "task,task", ",", "thread,project,agent"],
    "PVM_SUMMARIZER": ["gpt", "abstractive", "1"],
    "PVM_PAIR_TARGET": ["0", "101", "95%", "high"],
    "PVM_PAIR_ROUNDS": ["0", "21", "three"],
    "PVM_PAIR_K": ["0", "17", "x"],
    "PVM_PAIR_JUDGE": ["gpt", "rules"],
    "PVM_PAIR_REVISER": ["llm4", "checklist"],
    "PVM_SUMMARY_RECENT": ["0", "-1", "x"],
    "PVM_SUMMARY_CHUNK": ["0", "101", "x"],
    "PVM_SUMMARY_MAX_CHUNKS": ["1", "0", "x"],
    "PVM_SUMMARY_RATIO": ["0", "1.5", "nan"],
    "PVM_CONTEXT_RECENT_SHARE": ["-0.1", "1.1", "x"],
    "PVM_CONTEXT_RETRIEVED_SHARE": ["-0.1", "1.1", "x"],
}
FREE_TEXT = {
    "PVM_HOME",
    "PVM_LOG_DIR",
    "PVM_SPOOL_DIR",
    "PVM_QDRANT_API_KEY",
    "PVM_EMBED_MODEL",
    "OPENAI_API_KEY",
    "PVM_API_TOKEN",
    "PVM_API_TOKENS_FILE",
    "PVM_LLM_MODEL",
    "PVM_LLM_API_KEY",
}
SECRETS = {"PVM_QDRANT_API_KEY", "OPENAI_API_KEY", "PVM_API_TOKEN", "PVM_LLM_API_KEY"}

# -- valid values of every field, for the round trip ------------------------------------------------------------

_word = st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=12)
_text = st.text(min_size=1, max_size=30).map(str.strip).filter(bool)


def _url(*schemes: str) -> st.SearchStrategy[str]:
    ports = st.integers(1, 65535)
    return st.builds(lambda scheme, host, port: f"{scheme}://{host}:{port}", st.sampled_from(schemes), _word, ports)


_path = st.lists(_word, min_size=1, max_size=4).map(lambda parts: Path("/", *parts))
_seconds = st.floats(min_value=0.1, max_value=1e6, allow_nan=False)
_identifier = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
_dotted = st.lists(_identifier, min_size=2, max_size=4).map(".".join)
_weight = st.floats(min_value=0, max_value=10, allow_nan=False)

FIELD_VALUES: dict[str, st.SearchStrategy[object]] = {
    "redis_url": st.none() | _url("redis", "rediss", "unix"),
    "shards": st.integers(1, 1024),
    "home": _path,
    "log_dir": _path,
    "spool_dir": _path,
    "downstream": st.lists(st.sampled_from(sorted(set(keys.POOL_JOBS) - {"log"})), max_size=3).map(tuple),
    "recent_window": st.integers(1, 10**6),
    "minute_cache_size": st.integers(1, 10**7),
    "dispatch_batch": st.integers(1, 10**5),
    "fanout_batch": st.integers(1, 10**5),
    "claim_idle_ms": st.integers(1, 10**9),
    "max_deliveries": st.integers(1, 1000),
    "job_timeout": st.integers(1, 10**6),
    "qdrant_url": st.none() | _url("http", "https"),
    "qdrant_api_key": st.none() | _text,
    "embed_model": st.none() | _text,
    "openai_base_url": st.none() | _url("http", "https"),
    "openai_api_key": st.none() | _text,
    "embed_dimensions": st.none() | st.integers(1, 65536),
    "embed_batch_size": st.integers(1, 2048),
    "embed_max_retries": st.integers(0, 100),
    "embed_timeout_s": _seconds,
    "embed_query_timeout_s": st.floats(min_value=0.05, max_value=1e4, allow_nan=False),
    "search_weights": st.none() | st.tuples(_weight, _weight, _weight, _weight).filter(lambda w: sum(w) > 0),
    "api_url": st.none() | _url("http", "https"),
    "api_token": st.none() | _text,
    "api_tokens_file": st.none() | _path,
    "optimize_every_s": st.integers(0, 10**7),
    "search_hot_minutes": st.integers(0, 10**7),
    "extra_job_functions": st.lists(_dotted, max_size=3).map(tuple),
    "redis_start_wait_s": st.floats(min_value=0, max_value=1e6, allow_nan=False),
    "thread_by": st.permutations(["thread", "task", "project"]).flatmap(
        lambda order: st.integers(1, 3).map(lambda n: tuple(order[:n]))
    ),
    "summarizer": st.sampled_from(["extractive", "llm"]),
    "fact_statements": st.sampled_from(["keep", "off"]),
    "pair_target": st.integers(1, 100),
    "pair_rounds": st.integers(1, 20),
    "pair_k": st.integers(1, 16),
    "pair_judge": st.sampled_from(["checklist", "llm"]),
    "pair_reviser": st.sampled_from(["extractive", "llm"]),
    "summary_recent": st.integers(1, 10**4),
    "summary_chunk": st.integers(1, 100),
    "summary_max_chunks": st.integers(2, 10**4),
    "summary_ratio": st.floats(min_value=0.01, max_value=1.0, allow_nan=False),
    "context_recent_share": st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
    "context_retrieved_share": st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
    "llm_model": st.none() | _text,
    "llm_base_url": st.none() | _url("http", "https"),
    "llm_api_key": st.none() | _text,
    "llm_timeout_s": _seconds,
    "llm_max_retries": st.integers(0, 100),
    "llm_max_tokens": st.integers(1, 10**6),
    "llm_temperature": st.floats(min_value=0, max_value=2, allow_nan=False),
    "fact_promote_at": st.floats(min_value=0, max_value=1, allow_nan=False),
    "fact_tier_split": st.tuples(_weight, _weight, _weight).filter(lambda w: sum(w) > 0),
    "evaluate_every_s": st.integers(0, 10**7),
    "evaluate_slice": st.integers(1, 10**7),
    "score_weights": st.tuples(_weight, _weight, _weight, _weight).filter(lambda w: sum(w) > 0),
    "prune_below": st.floats(min_value=0, max_value=1, allow_nan=False),
    "prune_grace_s": st.integers(0, 10**9),
    "dedupe_at": st.floats(min_value=0, max_value=1, allow_nan=False),
    "fact_dedupe_at": st.floats(min_value=0, max_value=1, allow_nan=False),
}


def _field_of(env: str) -> str:
    (definition,) = [d for d in DEFINITIONS if d.env == env]
    return definition.field


# -- one declaration per field -----------------------------------------------------------------------------------


def test_every_field_is_declared_once_and_the_reference_lists_each_once() -> None:
    names = [f.name for f in dataclasses.fields(Settings)]
    assert [d.field for d in DEFINITIONS] == names
    reference = settings_reference()
    assert [row["env"] for row in reference] == [d.env for d in DEFINITIONS]
    assert len({row["env"] for row in reference}) == len(names)
    for row in reference:
        assert list(row) == ["env", "default", "type", "range", "help"], row
        assert all(isinstance(v, str) for v in row.values()), row
        assert row["help"] and row["type"], row
    assert set(BAD_VALUES) | FREE_TEXT == {d.env for d in DEFINITIONS}
    assert set(FIELD_VALUES) == set(names)


def test_the_module_docstring_holds_no_hand_written_table() -> None:
    assert "| PVM_" not in (pvm.config.__doc__ or "")
    assert "settings_reference" in (pvm.config.__doc__ or "")


def test_an_empty_environment_gives_the_declared_defaults() -> None:
    assert Settings.from_env({}) == Settings()
    s = Settings.from_env({})
    assert (s.shards, s.dispatch_batch, s.embed_batch_size) == (
        defaults.SHARDS,
        defaults.DISPATCH_BATCH_SIZE,
        defaults.EMBED_BATCH_SIZE,
    )
    assert s.redis_start_wait_s == defaults.REDIS_START_WAIT_S and s.downstream == defaults.DOWNSTREAM


@pytest.mark.parametrize("row", settings_reference(), ids=lambda row: row["env"])
def test_the_documented_default_is_the_default(row: dict[str, str]) -> None:
    """What the reference says a variable defaults to parses to what an unset variable gives."""
    field = _field_of(row["env"])
    unset = getattr(Settings.from_env({}), field)
    if row["default"].startswith("(unset"):
        assert unset in (None, ()), row
    elif row["default"].startswith("$PVM_HOME/"):
        s = Settings.from_env({"PVM_HOME": "/srv/pvm"})
        assert getattr(s, field) == Path("/srv/pvm") / row["default"].removeprefix("$PVM_HOME/")
    else:
        assert getattr(Settings.from_env({row["env"]: row["default"]}), field) == unset, row


def test_blank_values_mean_unset_except_for_lists_where_empty_means_none() -> None:
    blank = {d.env: " " for d in DEFINITIONS if d.env != "PVM_DOWNSTREAM"}
    assert Settings.from_env(blank) == Settings()
    assert Settings.from_env({"PVM_DOWNSTREAM": ""}).downstream == ()
    assert Settings.from_env({"PVM_DOWNSTREAM": " index , "}).downstream == ("index",)


# -- refusals ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "raw"), [(env, raw) for env, values in BAD_VALUES.items() for raw in values])
def test_a_bad_value_is_refused_naming_the_variable_and_the_fix(env: str, raw: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({env: raw})
    message = str(caught.value)
    assert message.startswith(f"{env}"), message
    assert "set " in message and "unset it" in message, message  # the fix: a value it takes, or the default


def test_refusals_say_what_would_do() -> None:
    def refusal(env: str, raw: str) -> str:
        with pytest.raises(ConfigError) as caught:
            Settings.from_env({env: raw})
        return str(caught.value)

    assert "is not a whole number" in refusal("PVM_SHARDS", "zero")
    assert ">= 1" in refusal("PVM_SHARDS", "0")
    assert "from 1 to 2048" in refusal("PVM_EMBED_BATCH_SIZE", "4096")  # refused, no longer quietly capped
    assert "finite" in refusal("PVM_EMBED_TIMEOUT", "nan")
    assert "(4)" in refusal("PVM_SHARDS", "0")  # the default it falls back to when unset
    assert "not a pool the log feeds" in refusal("PVM_DOWNSTREAM", "nosuchpool")
    assert "index" in refusal("PVM_DOWNSTREAM", "nosuchpool")  # the pools it may name
    assert "semantic,keyword,recency,importance" in refusal("PVM_SEARCH_WEIGHTS", "1,2,3")
    assert "task,project,global" in refusal("PVM_FACT_TIER_SPLIT", "40,40")
    assert "40,40,20" in refusal("PVM_FACT_TIER_SPLIT", "0,0,0")  # an example, and the default
    assert defaults.REDIS_URL_EXAMPLE in refusal("PVM_REDIS_URL", "localhost:6379")


def test_refusals_do_not_print_a_password() -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"PVM_REDIS_URL": "redi://:hunter2@redis.internal:6379/0"})
    assert "hunter2" not in str(caught.value) and "PVM_REDIS_URL" in str(caught.value)


def test_secrets_stay_out_of_repr() -> None:
    s = Settings.from_env({"OPENAI_API_KEY": "sk-one", "PVM_API_TOKEN": "tok-two", "PVM_QDRANT_API_KEY": "qk-three"})
    assert (s.openai_api_key, s.api_token, s.qdrant_api_key) == ("sk-one", "tok-two", "qk-three")
    for secret in ("sk-one", "tok-two", "qk-three"):
        assert secret not in repr(s)
    assert {row["env"] for row in settings_reference() if "secret" in row["type"]} == SECRETS


# -- round trip --------------------------------------------------------------------------------------------------


@given(st.fixed_dictionaries(FIELD_VALUES).map(lambda values: Settings(**values)))  # type: ignore[arg-type]
def test_to_env_reproduces_any_settings(s: Settings) -> None:
    env = s.to_env()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    assert set(env) <= {d.env for d in DEFINITIONS}
    assert Settings.from_env(env) == s


def test_to_env_leaves_unset_what_is_unset() -> None:
    env = Settings().to_env()
    assert "PVM_REDIS_URL" not in env and "PVM_SEARCH_WEIGHTS" not in env and "OPENAI_API_KEY" not in env
    assert env["PVM_SHARDS"] == str(defaults.SHARDS)
    assert math.isclose(float(env["PVM_EMBED_TIMEOUT"]), defaults.EMBED_TIMEOUT_S)


# -- one place for defaults --------------------------------------------------------------------------------------


def _numbers_and_strings(path: Path) -> list[tuple[int, str]]:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return [(t.start[0], t.string) for t in tokens if t.type in (tokenize.NUMBER, tokenize.STRING)]


@pytest.mark.parametrize("port", [defaults.API_PORT, defaults.EXPORTER_PORT])
def test_only_pvm_defaults_spells_a_port(port: int) -> None:
    spelled = []
    for package in ("contracts", "pvm", "workers", "bench"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "pvm" / "defaults.py":
                continue
            for line, text in _numbers_and_strings(path):
                if text.replace("_", "") == str(port) or f":{port}" in text or f"default {port}" in text:
                    spelled.append(f"{path.relative_to(ROOT)}:{line}: {text}")
    assert not spelled, "use pvm.defaults instead of repeating the port:\n" + "\n".join(spelled)
