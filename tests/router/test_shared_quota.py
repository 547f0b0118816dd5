"""Fleet-wide key quotas: two allocators (as two gateways would hold) against a real ZooKeeper.

Each FleetQuota here is what one gateway runs; both share one ZooKeeper path. The clocks are
fakes that the test moves, so bucket refills happen only when a test says so and the bounds
below are exact, not timing-dependent. The outage tests stop their own ZooKeeper server.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from support import wait_until
from vllm_fleet.errors import ConfigError, RateLimitedError
from vllm_fleet.router.quota.admission import Admission
from vllm_fleet.router.config import AdmissionConfig, KeyLimits
from vllm_fleet.router.features import SHORT
from vllm_fleet.router.quota.fleet import FleetQuota
from vllm_fleet.router.quota.bucket import Amount, lease
from vllm_fleet.router.quota.store import ZooKeeperQuotaStore
from zookeeper_server import ZooKeeperServer, zookeeper_server

pytestmark = pytest.mark.timeout(120)

KEY = "team-a"


@pytest.fixture(scope="module")
def zookeeper():
    yield from zookeeper_server()


class FakeClock:
    """Stands still until the test moves it; one instance serves as wall clock for both gateways."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    import time
    return FakeClock(time.time())


@pytest.fixture
async def quotas(clock):
    """`await make(hosts, cluster, limits)` → a started FleetQuota; all are closed after the test."""
    made: list[FleetQuota] = []

    async def make(hosts: str, cluster: str, limits: KeyLimits, **options) -> FleetQuota:
        store = ZooKeeperQuotaStore(f"zk://{hosts}/{cluster}", session_timeout_s=4.0, op_timeout_s=1.0)
        options.setdefault("metrics_registry", CollectorRegistry())
        quota = FleetQuota(store, clock=clock, wall=clock, **options)
        quota.update(AdmissionConfig(keys={KEY: limits}))
        await quota.start()
        made.append(quota)
        return quota

    yield make
    for quota in made:
        await quota.close()


def fresh_cluster() -> str:
    return f"quota-{uuid.uuid4().hex[:8]}"


async def admitted(quota: FleetQuota, tries: int, tokens: int = 1) -> int:
    count = 0
    for _ in range(tries):
        try:
            await quota.reserve(KEY, tokens)
            count += 1
        except RateLimitedError:
            pass
    return count


async def test_two_gateways_together_admit_the_limit_not_twice_it(zookeeper, quotas):
    cluster = fresh_cluster()
    a = await quotas(zookeeper.hosts, cluster, KeyLimits(requests_per_min=60))
    b = await quotas(zookeeper.hosts, cluster, KeyLimits(requests_per_min=60))
    await wait_until(lambda: a.gateways == 2 and b.gateways == 2, timeout=20, message="both gateways seen")
    total = 0
    for _ in range(60):  # alternate, as a client spreading over two gateways would
        total += await admitted(a, 1) + await admitted(b, 1)
    # Without sharing each would admit 60. Leases never over-admit; what one gateway holds
    # unspent (at most lease_fraction of the limit) is all the other may miss.
    assert 54 <= total <= 60
    with pytest.raises(RateLimitedError) as refused:
        await b.reserve(KEY, 1)
    assert refused.value.reason == "requests_per_min" and refused.value.retry_after > 0
    assert not a.in_fallback and not b.in_fallback


async def test_a_refill_of_the_shared_bucket_is_usable_from_either_gateway(zookeeper, quotas, clock):
    cluster = fresh_cluster()
    a = await quotas(zookeeper.hosts, cluster, KeyLimits(requests_per_min=60))
    b = await quotas(zookeeper.hosts, cluster, KeyLimits(requests_per_min=60))
    await admitted(a, 70)
    assert await admitted(b, 5) == 0
    clock.now += 10  # ten seconds refill ten requests, fleet-wide
    assert await admitted(b, 20) == 10


async def test_unused_tokens_go_back_to_the_fleet_when_a_gateway_is_idle(zookeeper, quotas, clock):
    cluster = fresh_cluster()
    limits = KeyLimits(tokens_per_min=1000)
    metrics = CollectorRegistry()
    a = await quotas(zookeeper.hosts, cluster, limits, idle_return_s=5.0, metrics_registry=metrics)
    b = await quotas(zookeeper.hosts, cluster, limits)
    c = await quotas(zookeeper.hosts, cluster, limits)
    await a.reserve(KEY, 600)     # reserves prompt estimate + max_tokens...
    a.settle(KEY, 600, 100)       # ...but used 100: 500 are A's again, not yet the fleet's
    with pytest.raises(RateLimitedError) as refused:
        await c.reserve(KEY, 800)
    assert refused.value.reason == "tokens_per_min"
    clock.now += 6  # A idle past idle_return_s; the bucket refills 100 tokens meanwhile
    await wait_until(lambda: (metrics.get_sample_value("vllm_fleet_quota_leases_total", {"result": "returned"})
                              or 0) >= 1, timeout=20, message="A to return its idle lease")
    await b.reserve(KEY, 800)     # fits only with A's 500 back: 1000 - 600 + 100 refilled < 800


async def test_admission_uses_the_fleet_quota_and_keeps_reloads_working(zookeeper, quotas):
    cluster = fresh_cluster()
    quota = await quotas(zookeeper.hosts, cluster, KeyLimits(requests_per_min=2))
    admission = Admission(AdmissionConfig(keys={KEY: KeyLimits(requests_per_min=2)}), quota=quota)
    for _ in range(2):
        (await admission.admit(key=KEY, workload_class=SHORT, tokens=10, timeout=None)).finish(5)
    with pytest.raises(RateLimitedError):
        await admission.admit(key=KEY, workload_class=SHORT, tokens=10, timeout=None)
    # A reload that lifts the limit lets the key through the shared bucket again.
    admission.update_limits(KeyLimits(), {KEY: KeyLimits(requests_per_min=600)})
    quota_other = await quotas(zookeeper.hosts, cluster, KeyLimits(requests_per_min=600))
    (await admission.admit(key=KEY, workload_class=SHORT, tokens=10, timeout=None)).finish(5)
    assert await admitted(quota_other, 1) == 1


async def test_unreachable_zookeeper_at_start_is_a_config_error():
    store = ZooKeeperQuotaStore("zk://127.0.0.1:1/x", op_timeout_s=0.5, connect_timeout_s=1.0)
    with pytest.raises(ConfigError, match="cannot reach ZooKeeper"):
        await FleetQuota(store, metrics_registry=CollectorRegistry()).start()


# The same table as tests/registry/test_zookeeper.py: both read zk:// URLs with one parser.
@pytest.mark.parametrize("url, reason", [
    ("http://zk:2181/x", "is not zk://host:port"),
    ("zk://zk/x", "'zk' in 'zk://zk/x' is not host:port"),
    ("zk://zk:2181/a/b", "cluster name 'a/b' in .* must contain no '/'"),
])
def test_a_bad_fleet_quota_url_names_the_option_and_the_problem(url, reason):
    with pytest.raises(ConfigError, match=f"^--fleet-quota.*{reason}"):
        ZooKeeperQuotaStore(url)


async def test_cut_off_gateways_admit_their_share_and_resync_when_zookeeper_returns(quotas, clock):
    workdir = Path(tempfile.mkdtemp(prefix="vllm-fleet-zk-outage-"))
    server = ZooKeeperServer(workdir)
    server.start()
    try:
        cluster = fresh_cluster()
        a = await quotas(server.hosts, cluster, KeyLimits(requests_per_min=60))
        b = await quotas(server.hosts, cluster, KeyLimits(requests_per_min=60))
        await wait_until(lambda: a.gateways == 2 and b.gateways == 2, timeout=20, message="both gateways seen")
        server.stop()
        await wait_until(lambda: a.in_fallback and b.in_fallback, timeout=20, message="both gateways in fallback")
        # Each admits its share, limit / 2, from its own bucket; nobody waits for ZooKeeper.
        assert await admitted(a, 40) == 30
        assert await admitted(b, 40) == 30
        server.start()
        await wait_until(lambda: not a.in_fallback and not b.in_fallback, timeout=30, message="resync")
        # What the fallback admitted is charged to the fleet's bucket as debt, so over the whole
        # episode the fleet stays within the limit + 10 % (without the charge: 60 + 10).
        after = await admitted(a, 5) + await admitted(b, 5)
        assert 60 + after <= 66
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_lease_is_between_need_and_want_and_never_more_than_the_level():
    limits = KeyLimits(requests_per_min=60, tokens_per_min=600)
    state, answer = lease(None, limits, 0.0, Amount(1, 100), Amount(10, 1000))
    assert answer.granted == Amount(10, 600) and state["tokens"] == 0
    _, refused = lease(state, limits, 0.0, Amount(1, 100), Amount(10, 1000))
    assert refused.granted is None and refused.reason == "tokens_per_min" and refused.retry_after == pytest.approx(10)
    # A request above the whole limit passes on a full bucket and leaves it in debt.
    state, big = lease(None, limits, 0.0, Amount(1, 900), Amount(1, 900))
    assert big.granted == Amount(1, 900) and state["tokens"] == -300
