"""The quota wing: admission in front of routing, and per-key budgets in one process, across a
gateway's processes, or for the whole fleet.

Modules:
    admission       Admission: a key's budget, then a slot of its workload class (bounded
                    queues); a Ticket settles the reservation with the real usage
    key_limiter     KeyLimiter and TokenBucket: per-key request and token buckets of this process
    shared_buckets  the same buckets in a mapped file, shared by a `gateway --processes N`
    fleet           FleetQuota: per-key budgets for the whole fleet, leased from ZooKeeper
    bucket          the fleet-wide bucket of one key, as pure functions over its stored state
    store           ZooKeeperQuotaStore: one znode per key
    metrics         QuotaMetrics: Prometheus metrics of the fleet quota

Imports run one way: admission -> key_limiter -> shared_buckets; fleet -> (key_limiter, bucket,
store, metrics). Admission takes the fleet quota as a KeyQuota (its protocol), so it does not
import fleet.py, and fleet.py does not import admission.py.
"""
