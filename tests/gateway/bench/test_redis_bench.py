"""``carpool bench redis``'s arithmetic on made-up samples (the run itself needs real servers
and processes, and is the benchmark's): commands per token, the busiest node's share and CPU
per token, the saturating rate and fleet size, and the 1 -> 3 master ratio derived from the
per-node cost, each checked against the sums written out by hand."""

from __future__ import annotations

import argparse
from collections import Counter

import pytest

from gateway.bench.redis import Row, fit_line, main, print_fit, print_ratio, print_table
from gateway.bench.redis_fleet import Sample


def row(masters: int, per_node: list[int], cpu_s: list[float], tokens: int = 1000,
        length: int = 64) -> Row:
    commands = [Counter({"evalsha": n // 2, "xadd": n - n // 2}) for n in per_node]
    return Row(masters, 4, 100, Sample(commands, cpu_s, secs=2.0, tokens=tokens), length)


def test_the_columns_and_the_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    one = row(1, [3000], [0.04])
    three = row(3, [400, 350, 250], [0.01, 0.008, 0.006])
    assert one.per_token == 3.0 and three.per_token == 1.0
    assert three.top_share == 0.4
    assert three.cpu_per_token == pytest.approx(0.01 / 1000)
    print_table([one, three], argparse.Namespace(streams=32, tpot_ms=25.0))
    table = capsys.readouterr().out
    # one node saturates at 1 / (40 us) = 25,000 tokens/s: 19.5 workers of 32 x 1/25 ms
    assert "| 1 | 4 | 100 | 64 | 3.00 | 500 | 1,500 | 100% | 40.0 | 25,000 | 20 |" in table
    print_ratio([one, three])
    ratio = capsys.readouterr().out
    assert "by CPU per token 4.00x" in ratio  # 40 us / 10 us
    assert "on the busiest node 7.50x" in ratio  # 3 / (1 x 0.4)
    assert "at most 40% of the commands" in ratio


def test_masters_other_than_1_and_3_are_refused() -> None:
    with pytest.raises(SystemExit):
        main(["--masters", "2"])


def test_the_fixed_and_marginal_costs_are_the_line_through_the_lengths(
        capsys: pytest.CaptureFixture[str]) -> None:
    # 50 commands a request plus 1.25 a token: 130 a request at 64 tokens, 370 at 256;
    # 100 requests each, so 6,400 and 25,600 tokens
    short = row(1, [13_000], [0.1], tokens=6_400, length=64)
    long = row(1, [37_000], [0.2], tokens=25_600, length=256)
    assert fit_line([(64, 130.0), (256, 370.0)]) == pytest.approx((50.0, 1.25))
    assert fit_line([(0, 1.0), (1, 2.0), (2, 3.5)]) == pytest.approx((0.9166667, 1.25))
    print_fit([short, long])
    assert "| 1 | 4 | 100 | 50.0 | 1.25 |" in capsys.readouterr().out
    print_fit([short])  # one length: nothing to fit
    assert capsys.readouterr().out == ""
