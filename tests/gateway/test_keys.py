"""The keys file: hashed keys, limits, each bad line named, and the `gateway keys` commands."""

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


def test_store_replace_revokes_at_once(tmp_path):
    path = tmp_path / "keys.jsonl"
    write_keys(path, [KeyRecord("a", hash_key("k1")), KeyRecord("b", hash_key("k2"), admin=True)])
    store = KeyStore(path)
    assert store.authenticate("k2").admin
    store.replace(read_keys(path)[:1])
    assert store.authenticate("k2") is None
    assert store.authenticate("k1").id == "a"


SHA = "ab" * 32


@pytest.mark.parametrize("line, problem", [
    ('{"id": "a"}', "field 'sha256' must be a non-empty string"),
    ('{"id": "a", "sha256": "sk-plaintext"}', "64 hex digits"),
    ('{"id": "a", "sha256": "%s", "admin": "false"}' % SHA, "field 'admin' must be true or false"),
    ('{"id": "a", "sha256": "%s", "limits": {"requests_per_min": -1}}' % SHA, "limits.requests_per_min"),
    ('{"id": "a", "sha256": "%s", "limits": {"requests_per_mn": 5}}' % SHA, "limits.requests_per_mn"),
    ('{"id": "a", "sha256": "%s", "limits": 5}' % SHA, "field 'limits' must be an object"),
    ("{not json", "not a key record"),
    ("[1, 2]", "must be a JSON object"),
])
def test_bad_lines_are_named(tmp_path, line, problem):
    path = tmp_path / "keys.jsonl"
    path.write_text("# comment\n" + line + "\n")
    with pytest.raises(ConfigError, match=problem) as info:
        read_keys(path)
    assert ":2:" in str(info.value)
