"""bench/fusion.py on a smaller toy set: every fusion candidate reported, and the learned calibration trained on
another draw of the set than the one it ranks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import fusion

FUSIONS = {"dense_only", "agree", "max", "minmax", "rrf", "engine_rrf", "engine_dbsf", "learned"}


@pytest.fixture
def small_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fusion, "TOPICS", 40)  # 160 minutes, 40 queries: seconds, not a minute


def test_the_json_report_gives_every_fusion_for_every_dense_leg(
    small_set: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert fusion.main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["queries"] == 40 and out["minutes"] == 160
    for quality in fusion.QUALITIES:
        assert set(out[quality]) >= FUSIONS
        for name in FUSIONS:
            assert 0.0 <= out[quality][name]["recall_at_5"] <= out[quality][name]["recall_at_10"] <= 1.0
        best = max(out["lexical_only"]["recall_at_10"], out[quality]["dense_only"]["recall_at_10"])
        assert out[quality]["hybrid_minus_best_leg"] == pytest.approx(out[quality]["agree"]["recall_at_10"] - best)
    # A calibration learned with a good dense leg finds what that leg finds; one learned with a noise leg learns to
    # follow the words (a useless leg's scores get little weight): near the words, far above the noise leg itself.
    assert out["good"]["learned"]["recall_at_10"] > out["lexical_only"]["recall_at_10"]
    assert out["noise"]["learned"]["recall_at_10"] > 0.8 * out["lexical_only"]["recall_at_10"]
    assert out["noise"]["learned"]["recall_at_10"] > 3 * out["noise"]["dense_only"]["recall_at_10"]


def test_the_calibration_never_trains_on_the_queries_it_ranks(small_set: None) -> None:
    ranked = fusion.labeled_set(7)
    trained = fusion.labeled_set(7 + fusion.CALIBRATION_SEED_OFFSET)
    assert not {text for text, _ in ranked.queries} & {text for text, _ in trained.queries}
    assert not set(ranked.concept_of) & set(trained.concept_of)  # not even the made-up words


def test_the_calibration_ranks_what_its_features_separate_first() -> None:
    # Positives have a high first feature; a few of them among many negatives (the balance weighs them up).
    rng = np.random.default_rng(3)
    x = rng.normal(size=(400, 3))
    y = (x[:, 0] > 1.2).astype(float)
    model = fusion.Calibration().fit(x, y)
    order = np.argsort(-model.score(x))
    top = int(y.sum())
    assert y[order[:top]].mean() > 0.9
    with pytest.raises(AssertionError, match="fit first"):
        fusion.Calibration().score(x)
