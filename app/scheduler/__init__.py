"""The scheduler of docs/scheduler.md, one module per section of the doc.

- ``cost``: what a batch costs (section 1), measured at warm-up and refined by every batch.
- ``waiting``: wait for more items or go (section 2): ``BatchPolicy``, ``collect_batch`` and the
  estimators it reads (arrival gaps, a closed loop's round trip, requests expected in flight).
- ``admission``: room by priority level (section 3) and refusing at arrival a request that would
  miss its deadline (section 4).
- ``lengths``: which waiting items form a text batch of similar lengths (section 5).
- ``fairness``: which model's batch a device thread runs next (docs/models.md).

Every module here is pure or nearly so: the clock, the queue and the device are handed in.
"""
