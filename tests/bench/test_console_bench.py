"""bench/console.py on a small project: every page of the console answers 200 over HTTP and is timed, with the
ids it opened and the machine; and the arguments it refuses."""

from __future__ import annotations

import json

import pytest

from bench import console


def test_every_page_answers_and_is_timed_with_a_verdict_each(capsys: pytest.CaptureFixture[str]) -> None:
    assert console.main(["--minutes", "1000", "--calls", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pages_not_200"] == {}, out["pages_not_200"]
    names = set(console.pages({"minute": "m", "fact": "f", "thread": "t", "agent": "a"}, console.random.Random(1)))
    assert set(out["page_p99_ms"]) == names and set(out["met"]) == {f"page_p99_ms.{n}" for n in names}
    for name in names:
        assert 0 < out["page_p50_ms"][name] <= out["page_p99_ms"][name]
        assert out["page_bytes"][name] > 500  # a whole page, not an error stub
    # The pages were opened on real ids from the stores: a minute, a fact, a thread of the measured project.
    assert all(out["ids"][k] for k in ("minute", "fact", "thread", "agent")), out["ids"]
    assert out["machine"]["cores"] >= 1 and out["config"]["minutes"] == 1000


@pytest.mark.parametrize("argv", [["--minutes", "10"], ["--calls", "1"]])
def test_too_small_a_run_is_refused_with_the_reason(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        console.main(argv)
    assert argv[0] in capsys.readouterr().err
