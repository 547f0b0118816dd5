"""Router options on the command line: each setting is an option, bad values say what to fix."""

from __future__ import annotations

import argparse
import json

import pytest

from fakes import addresses, snapshot, view
from vllm_fleet.errors import ConfigError
from vllm_fleet.router import KeyLimits, RouterConfig, add_router_options, router_config_from_args
from vllm_fleet.router.cache.match import CacheMatch
from vllm_fleet.router.cache.tuning import CacheTuning
from vllm_fleet.router.features import RequestFeatures
from vllm_fleet.router.policies import CacheAware, CacheCosts

A, B = addresses(2)


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
    # A config file's null, on the command line: no affinity bound, no absolute ITL target.
    config = parse("--affinity-load-bound", "none", "--interactive-itl-target-ms", "None")
    assert config.affinity_load_bound is None and config.classes.interactive_itl_target_ms is None
    config = parse("--affinity-load-bound", "null", "--interactive-itl-target-ms", "300")
    assert config.affinity_load_bound is None and config.classes.interactive_itl_target_ms == 300.0


def test_a_bound_that_is_neither_a_number_nor_none_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        parse("--affinity-load-bound", "high")
    assert "--affinity-load-bound" in capsys.readouterr().err


def test_the_gateway_offers_three_cache_options_and_keeps_the_tuning_internal():
    from vllm_fleet.cli import gateway

    subparsers = argparse.ArgumentParser().add_subparsers()
    gateway.register(subparsers)
    flags = {flag for action in subparsers.choices["gateway"]._actions for flag in action.option_strings}
    assert {flag for flag in flags if flag.startswith("--cache-")} == {
        "--cache-load-weight", "--cache-index-max-entries", "--cache-home-tokens"}
    assert not any("tuning" in flag for flag in flags)


def test_the_cache_tuning_reaches_the_policy():
    # A holds 2,000 of the prompt's 2,100 tokens and has 2,200 tokens more load than B: the copy
    # term keeps the hit on A; a tuning without it sends the hit to B (test_cache_aware_policy).
    pool = snapshot(view(A, kv_events_fresh=True, outstanding=2200), view(B, kv_events_fresh=True))
    hit, held = RequestFeatures(model="m", prompt_tokens=2100, max_tokens=100), CacheMatch(cached_tokens={A: 2000})
    with_copy = RouterConfig(policy="cache_aware", cache_load_weight=1.0, cache_tuning=CacheTuning(load_bound=None))
    no_copy = with_copy.model_copy(update={"cache_tuning": CacheTuning(load_bound=None, copy_weight=0)})
    assert CacheAware(CacheCosts.of(with_copy)).rank(hit, pool, held) == [A, B]
    assert CacheAware(CacheCosts.of(no_copy)).rank(hit, pool, held) == [B, A]
    assert CacheCosts.of(RouterConfig()) == CacheCosts()  # the defaults route as before the move
