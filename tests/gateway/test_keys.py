"""The keys file: hashed keys, limits, reload on change, and the `gateway keys` commands."""

from __future__ import annotations

import os

import pytest

from vllm_fleet.cli import main
from vllm_fleet.errors import ConfigError
from vllm_fleet.gateway.keys import KeyRecord, KeyStore, hash_key, read_keys, write_keys


def test_cli_add_list_revoke(tmp_path, capsys):
    path = tmp_path / "keys.jsonl"
    assert main(["gateway", "keys", "add", "--file", str(path), "--id", "team-a", "--requests-per-min", "60"]) == 0
    key = capsys.readouterr().out.strip()
    assert key.startswith("sk-fleet-")
    assert key not in path.read_text()  # only the hash is stored
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    store = KeyStore(path)
    assert store.authenticate(key).limits == {"requests_per_min": 60.0}
    assert store.authenticate(key + "x") is None
    assert main(["gateway", "keys", "list", "--file", str(path)]) == 0
    assert "team-a\trequests_per_min=60" in capsys.readouterr().out
    assert main(["gateway", "keys", "add", "--file", str(path), "--id", "team-a"]) == 2  # duplicate id
    assert main(["gateway", "keys", "revoke", "--file", str(path), "--id", "team-a"]) == 0
    assert read_keys(path) == []


def test_store_picks_up_revocation(tmp_path):
    path = tmp_path / "keys.jsonl"
    write_keys(path, [KeyRecord("a", hash_key("k1")), KeyRecord("b", hash_key("k2"), admin=True)])
    store = KeyStore(path, recheck_s=0)
    assert store.authenticate("k2").admin
    write_keys(path, [KeyRecord("a", hash_key("k1"))])
    os.utime(path, ns=(1, 1))  # a different mtime even on coarse clocks
    assert store.authenticate("k2") is None
    assert store.authenticate("k1").id == "a"


def test_broken_edit_keeps_previous_keys(tmp_path):
    path = tmp_path / "keys.jsonl"
    write_keys(path, [KeyRecord("a", hash_key("k1"))])
    store = KeyStore(path, recheck_s=0)
    path.write_text("{not json\n")
    assert store.authenticate("k1").id == "a"


@pytest.mark.parametrize("line, problem", [
    ('{"id": "a"}', "not a key record"),
    ('{"id": "a", "sha256": "sk-plaintext"}', "64 hex digits"),
])
def test_bad_lines_are_named(tmp_path, line, problem):
    path = tmp_path / "keys.jsonl"
    path.write_text("# comment\n" + line + "\n")
    with pytest.raises(ConfigError, match=problem) as info:
        read_keys(path)
    assert ":2:" in str(info.value)
