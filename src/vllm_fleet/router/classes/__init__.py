"""The classes wing: service classes, interactive first and batch in what it leaves idle.

Modules:
    service_class  ServiceClassConfig and the rules on it: slots, busy, batch share, slack,
                   room, the starvation guard (pure functions of a WorkerView)
    batch_gate     BatchGate: this router's batch per worker, its stepping aside, and the latency
                   controller that caps it; follows the pool as a PoolListener
    batch_hook     BatchHook: the gate as an attempt hook (router/attempt_hooks.py): a batch
                   attempt's withdrawal, pause and priority; interactive latency steering
    batch_wait     BatchWaits: batch requests waiting for slack, since when and why

Imports run one way: batch_wait -> batch_gate and batch_hook -> batch_gate -> service_class -> pool/snapshot.
"""
