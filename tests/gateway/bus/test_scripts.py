"""``bus/scripts.py`` and ``bus/state_scripts.py`` (the claim and the backlog read, split off
for the module size limit) hold every Lua script, each one compiles in a real server, and
every other module reaches Redis scripting only through ``resp.LuaScript``."""

from __future__ import annotations

from pathlib import Path

import redis

from gateway.bus import scripts, state_scripts

GATEWAY = Path(__file__).resolve().parents[3] / "gateway"


def _script_sources() -> dict[str, str]:
    return {name: value for module in (scripts, state_scripts)
            for name, value in vars(module).items()
            if name.endswith("_LUA") and isinstance(value, str)}


def test_every_script_compiles(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        found = _script_sources()
        assert {"ADMIT_LUA", "SETTLE_LUA", "CLAIM_LUA", "BACKLOG_LUA", "CANCEL_LUA",
                "STEP_LUA"} <= set(found)
        for name, source in found.items():
            if not name.startswith("_"):  # fragments are compiled as part of the others
                assert client.script_load(source), name
    finally:
        client.close()


def test_no_lua_outside_scripts_module() -> None:
    offenders = []
    for path in GATEWAY.rglob("*.py"):
        text = path.read_text()
        if path.name in ("scripts.py", "state_scripts.py") and path.parent.name == "bus":
            continue
        if "redis.call(" in text or "redis.pcall(" in text:
            offenders.append(f"{path}: Lua source")
        if "register_script(" in text and path.name != "resp.py":
            offenders.append(f"{path}: its own script loader")
    assert not offenders, offenders
