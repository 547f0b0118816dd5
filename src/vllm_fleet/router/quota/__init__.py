"""Per-key quotas beyond one process: shared by a gateway's processes (`shared_buckets.py`) or by the
whole fleet through ZooKeeper (`fleet.py`, `bucket.py`, `store.py`)."""
