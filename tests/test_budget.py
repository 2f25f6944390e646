"""`rollnet budget` and its arithmetic: the article's numbers, the codec-calibrated sparse payload, errors."""

from __future__ import annotations

import pytest
from rollnet.node.budget import parse_duration, parse_params, parse_rate, payload_bytes, predict
from rollnet.node.errors import ConfigError

from rollnet.cli import main


def test_the_articles_numbers() -> None:
    full = predict(8e9, 1e9, sparse=False, step_s=30)
    assert full.payload_bytes == 16e9 and full.broadcast_s == pytest.approx(128.0)  # "128 seconds of copying"
    assert full.staleness == pytest.approx(128 / 30) and not full.fits
    assert payload_bytes(32e9, sparse=False) == 64e9  # INTELLECT-2's 32B: 64 GB


def test_sparse_payload_matches_the_codec_measurements() -> None:
    for change, measured_ratio in ((0.01, 154.0), (0.001, 1155.9), (0.05, 39.9)):
        ratio = payload_bytes(1e9, sparse=False) / payload_bytes(1e9, sparse=True, change=change)
        assert ratio == pytest.approx(measured_ratio, rel=0.03)
    sparse = predict(8e9, 1e9, step_s=30)
    assert sparse.fits and sparse.staleness < 0.05
    assert predict(70e9, 100e6, step_s=30, overhead=2.2).staleness > 4  # a slow link still breaks the budget


@pytest.mark.parametrize(("parse", "text", "value"), [
    (parse_params, "8B", 8e9), (parse_params, "135M", 135e6), (parse_params, "1.5b", 1.5e9),
    (parse_rate, "1gbps", 1e9), (parse_rate, "100Mbps", 1e8), (parse_rate, "10 Gbit/s", 1e10),
    (parse_duration, "30s", 30), (parse_duration, "2m", 120), (parse_duration, "800ms", 0.8),
])
def test_parsing(parse, text: str, value: float) -> None:  # noqa: ANN001
    assert parse(text) == pytest.approx(value)


@pytest.mark.parametrize(("parse", "text"), [(parse_params, "8x"), (parse_rate, "fast"), (parse_duration, "0s")])
def test_parsing_errors_name_the_text(parse, text: str) -> None:  # noqa: ANN001
    with pytest.raises(ConfigError, match=repr(text)):
        parse(text)


def test_budget_command(capsys: pytest.CaptureFixture) -> None:
    assert main(["budget", "--params", "8B", "--link", "1gbps", "--full", "--step-time", "30s"]) == 0
    out = capsys.readouterr().out
    assert "16 GB" in out and "128 s" in out and "over budget" in out
    assert main(["budget", "--table"]) == 0
    table = capsys.readouterr().out
    assert all(model in table for model in ("1B", "70B")) and "100gbps" in table
    assert main(["budget", "--link", "warp"]) == 1
    assert "cannot read a link rate from 'warp'" in capsys.readouterr().err
