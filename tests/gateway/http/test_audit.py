"""The audit trail over real HTTP: every admin action (tenant created, changed, deleted; key
issued, rotated, revoked; budget changed; admin key created) is appended with when, which
admin key id, from which address and what changed, never a secret; ``GET /admin/audit``,
``/admin/stats`` (the console's last 20) and ``carpool tenants audit`` read it."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx
import pytest

from gateway.tenancy.keys import key_digest, key_id
from tests.gateway.harness import SECRET

pytestmark = pytest.mark.timeout(90)
ADMIN_KEY = "cp-admin-" + "a" * 32


def test_admin_actions_are_audited(echo_gateway: Any, redis_url: str) -> None:
    gw = echo_gateway
    gw.call(gw.services.store.add_admin_key(ADMIN_KEY))
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    url = gw.url + "/admin"
    assert httpx.post(url + "/tenants", headers=admin, json={"id": "aud", "rpm": 5}
                      ).status_code == 201
    assert httpx.patch(url + "/tenants/aud", headers=admin, json={"rpm": 7}).status_code == 200
    assert httpx.patch(url + "/tenants/aud", headers=admin,
                       json={"budget_tokens": 1000}).status_code == 200
    issued = httpx.post(url + "/tenants/aud/keys", headers=admin, json={"name": "ci"}).json()
    rotated = httpx.post(url + f"/tenants/aud/keys/{issued['key_id']}/rotate", headers=admin,
                         json={"grace_s": 60}).json()
    assert httpx.delete(url + f"/tenants/aud/keys/{rotated['key']}", headers=admin
                        ).status_code == 200  # revoked by the full key: audited by its id
    ro = httpx.post(url + "/keys", headers=admin, json={"read_only": True}).json()
    assert httpx.delete(url + "/tenants/aud", headers=admin).status_code == 200
    # a refused change is not an action
    assert httpx.patch(url + "/tenants/aud", headers=admin, json={"rpm": -1}).status_code == 404

    r = httpx.get(url + "/audit", params={"count": 8}, headers=admin)
    assert r.status_code == 200
    entries = r.json()["data"]
    assert [e["action"] for e in entries] == [
        "tenant.delete", "admin_key.create", "key.revoke", "key.rotate", "key.issue",
        "budget.update", "tenant.update", "tenant.create"]
    me = key_id(key_digest(SECRET, ADMIN_KEY))
    assert {e["admin_key_id"] for e in entries} == {me}
    assert {e["address"] for e in entries} == {"127.0.0.1"}
    by = {e["action"]: e for e in entries}
    assert by["tenant.update"]["before"] == {"rpm": 5} and by["tenant.update"]["after"] == {
        "rpm": 7}
    assert by["budget.update"]["after"] == {"budget_tokens": 1000}
    assert by["tenant.create"]["before"] is None and by["tenant.create"]["after"]["rpm"] == 5
    assert by["key.revoke"]["target"] == f"aud/{rotated['key_id']}"
    assert by["key.rotate"]["after"]["new_key_id"] == rotated["key_id"]
    assert by["tenant.delete"]["after"] is None and entries[0]["ts"] >= entries[-1]["ts"]
    text = r.text
    for secret in (issued["key"], rotated["key"], ro["key"]):
        assert secret not in text and secret[3:] not in text
    # paging back, the console's last 20, bad input
    older = httpx.get(url + "/audit", params={"count": 2, "before": entries[5]["id"]},
                      headers=admin).json()["data"]
    assert [e["id"] for e in older] == [entries[6]["id"], entries[7]["id"]]
    stats = httpx.get(url + "/stats", headers=admin).json()
    assert stats["audit"][0]["action"] == "tenant.delete" and len(stats["audit"]) <= 20
    for params in ({"count": "0"}, {"count": "x"}, {"count": "5000"}, {"before": "nope"}):
        bad = httpx.get(url + "/audit", params=params, headers=admin)
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    # the read-only key reads it too
    assert httpx.get(url + "/audit", headers={"Authorization": f"Bearer {ro['key']}"}
                     ).status_code == 200

    env = {"REDIS_URL": redis_url, "CARPOOL_NAMESPACE": gw.config.namespace,
           "CARPOOL_SECRET": SECRET.decode(), "PATH": "/usr/bin:/bin"}

    def cli(*args: str) -> str:
        res = subprocess.run([sys.executable, "-m", "gateway.cli.main", "tenants", *args],
                             env=env, capture_output=True, text=True, timeout=30, check=False)
        assert res.returncode == 0, res.stdout + res.stderr
        return res.stdout

    out = cli("create", "aud-cli", "--tpm", "100")
    cli_key = out.split("key (shown once): ")[1].split()[0]
    cli("set-quota", "aud-cli", "--budget-cost", "5")
    lines = [json.loads(ln) for ln in cli("audit", "--count", "3").splitlines()]
    assert [e["action"] for e in lines] == ["budget.update", "key.issue", "tenant.create"]
    assert {e["admin_key_id"] for e in lines} == {"cli"}
    assert cli_key not in cli("audit")
