"""Router options on the command line: each setting is an option, bad values say what to fix."""

from __future__ import annotations

import argparse
import json

import pytest

from vllm_fleet.errors import ConfigError
from vllm_fleet.router import KeyLimits, RouterConfig, add_router_options, router_config_from_args


def parse(*argv: str) -> RouterConfig:
    parser = argparse.ArgumentParser()
    add_router_options(parser)
    return router_config_from_args(parser.parse_args(list(argv)))


def test_no_options_give_the_defaults():
    assert parse() == RouterConfig()


def test_routing_and_admission_options_reach_the_config(tmp_path):
    limits = tmp_path / "keys.json"
    limits.write_text(json.dumps({"team-a": {"requests_per_min": 600, "tokens_per_min": 90000}}))
    config = parse("--policy", "session_affinity", "--stall-timeout-s", "2.5", "--affinity-load-bound", "1.5",
                   "--key-requests-per-min", "60", "--key-limits", f"@{limits}", "--short-max-in-flight", "8",
                   "--class-pools")
    assert config.policy == "session_affinity" and config.stall_timeout_s == 2.5
    assert config.affinity_load_bound == 1.5
    assert config.admission.default == KeyLimits(requests_per_min=60)
    assert config.admission.keys["team-a"] == KeyLimits(requests_per_min=600, tokens_per_min=90000)
    assert config.admission.short_max_in_flight == 8 and config.admission.class_pools


@pytest.mark.parametrize("argv, fragment", [
    (["--stall-timeout-s", "0"], "--stall-timeout-s"),
    (["--key-limits", "{not json"], "not valid JSON"),
    (["--key-limits", '{"k": 5}'], "must be an object"),
    (["--key-limits", '{"k": {"requests_per_minute": 5}}'], "requests-per-minute"),
    (["--key-limits", "@/nonexistent/keys.json"], "cannot read"),
])
def test_bad_values_are_config_errors_naming_the_option(argv, fragment):
    with pytest.raises(ConfigError, match=fragment):
        parse(*argv)


def test_unknown_policy_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        parse("--policy", "fastest")
    assert "least_outstanding" in capsys.readouterr().err


def test_none_turns_off_a_bound_or_target_that_defaults_on():
    # A config file's null, on the command line: no load bound, the ring alone for a new prefix's
    # home, no absolute ITL target.
    config = parse("--cache-load-bound", "none", "--cache-home-balance", "null", "--interactive-itl-target-ms", "None",
                   "--affinity-load-bound", "2")
    assert config.cache_load_bound is None and config.cache_home_balance is None
    assert config.classes.interactive_itl_target_ms is None and config.affinity_load_bound == 2.0


def test_a_bound_that_is_neither_a_number_nor_none_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        parse("--cache-load-bound", "high")
    assert "--cache-load-bound" in capsys.readouterr().err
