"""The pool wing: which workers there are, how each is doing, and an attempt's claim on one.

Modules:
    membership  Pool: registry membership, each worker's Info, health and Loads, leases and
                verdicts, progress; tells its listeners of joins, leaves, Infos and Loads
    worker      WorkerState: what the router tracks about one worker (mutable, the pool's own)
    lease       Lease: one attempt's claim on a worker (in flight, tokens owed, breaker probe)
    listener    PoolListener: the protocol by which cache routing and the batch gate follow workers
    snapshot    PoolSnapshot and WorkerView: the immutable view policies rank; state constants
    breaker     CircuitBreaker: per worker, closed / open / half-open
    ejection    OutlierDetector: ejects a worker failing many more requests than its peers

Imports run one way: membership -> (worker, lease, listener, breaker, ejection) -> snapshot. The
pool imports nothing of the other wings; the Router registers their listeners on it.
"""
