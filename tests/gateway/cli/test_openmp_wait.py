"""serve's OpenMP wait choice: PASSIVE by default; the spin only with the opt-in adaptive
thread count (CARPOOL_ADAPTIVE_THREADS=1); a policy or spin count already set wins; one set empty counts as unset."""

from __future__ import annotations

import os

import pytest

from gateway.cli.main import ADAPTIVE_SPINCOUNT, _set_openmp_wait

VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "CARPOOL_ADAPTIVE_THREADS")


@pytest.mark.parametrize(("given", "policy", "spin"), [
    ({}, "PASSIVE", None),
    ({"CARPOOL_ADAPTIVE_THREADS": "1"}, None, ADAPTIVE_SPINCOUNT),
    ({"CARPOOL_ADAPTIVE_THREADS": "0"}, "PASSIVE", None),
    ({"CARPOOL_ADAPTIVE_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}, "PASSIVE", None),
    ({"GOMP_SPINCOUNT": "500"}, None, "500"),
    ({"OMP_WAIT_POLICY": ""}, "PASSIVE", None),  # empty: as if unset
    ({"OMP_WAIT_POLICY": " ", "GOMP_SPINCOUNT": ""}, "PASSIVE", None),
    ({"CARPOOL_ADAPTIVE_THREADS": "1", "OMP_WAIT_POLICY": ""}, None, ADAPTIVE_SPINCOUNT),
])
def test_the_wait_setting(monkeypatch: pytest.MonkeyPatch, given: dict[str, str],
                          policy: str | None, spin: str | None) -> None:
    for name in VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    _set_openmp_wait()
    assert (os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT")) == (policy, spin)
