"""``carpool bench gateway``'s table: the ledger on/off rows are compared with each other,
not with the direct baseline."""

from __future__ import annotations

from argparse import Namespace

from gateway.bench.gateway import Row, table


def test_ledger_rows_have_no_direct_comparison() -> None:
    direct = [Row("direct (in-process engine.generate)", [0.010] * 10, 1.0, 160),
              Row("direct streamed tokens", [0.5] * 2, 1.0, 1024),
              Row("direct @ 200 req/s", [0.010] * 10, 1.0)]
    gw = [Row("gateway non-streaming", [0.012] * 10, 1.0, 160),
          Row("gateway 1 token, one at a time, ledger on", [0.004] * 10, 1.0),
          Row("gateway 1 token, one at a time, ledger off", [0.004] * 10, 1.0)]
    lines = table(direct, gw, Namespace(rate=200.0)).splitlines()
    assert lines[5].startswith("| gateway non-streaming | 12.00 | 12.00 | 2.00 |")
    assert lines[6] == ("| gateway 1 token, one at a time, ledger on | 4.00 | 4.00 | - | - | 10 "
                        "| - | - |")
