"""The shares record as the scripts write it and :mod:`fairq.store.shares` reads it.

One hash per base queue and 10-second bucket (``B:s:<bucket>``, see :mod:`fairq.keys`),
kept :data:`SHARES_TTL_S`. Its fields:

* ``n``: backlog samples taken in the bucket (``sample_shares.lua``, from maintenance);
* ``s:<flow>``: the flow's entitled share summed over those samples (at each sample, its
  tenant's weight over the summed weights of the backlogged tenants, times the flow's
  key weight over its tenant's backlogged keys' weights);
* ``r:<flow>`` / ``d:<flow>``: runs the flow received, and their run time (ms), counted
  when each run finishes (ack, nack, reclaim) in the bucket of its lease start.

The constants below are their one definition; the loader generates the Lua side from
them (:mod:`fairq.store.shared`).
"""

from __future__ import annotations

from typing import Final

from fairq.store.history import HISTORY_BUCKET_MS, HISTORY_WINDOW_MS

#: Width of one shares bucket (ms): the history's.
SHARES_BUCKET_MS: Final = HISTORY_BUCKET_MS
#: The longest window a reader asks for (ms).
SHARES_WINDOW_MS: Final = HISTORY_WINDOW_MS
#: The windows the stats, the dashboard and the metrics show (s).
SHARES_WINDOWS_S: Final = (60, 300, 900)
#: How long a bucket is kept (s): the longest window and five minutes more.
SHARES_TTL_S: Final = SHARES_WINDOW_MS // 1000 + 300
#: A bucket without a sample takes the last sample of up to this many buckets before it.
SHARES_HOLD_BUCKETS: Final = 6
#: Most fields one bucket holds before new flows are counted together.
SHARES_MAX_FIELDS: Final = 768
#: The field counting a bucket's samples, and the prefixes of a flow's fields.
SAMPLES_FIELD: Final = "n"
SHARE_PREFIX: Final = "s:"
RUNS_PREFIX: Final = "r:"
RUN_MS_PREFIX: Final = "d:"
#: The flow standing for the flows a full bucket has no field for (no flow has ``~``).
OVERFLOW_FLOW: Final = "~"
#: Most ready queues (of one shard) and flows (of one queue) a sample may read (the
#: bounds of its arguments), and what maintenance asks for: few enough that one sample
#: stays a short script (a bucket keeps about 256 flows anyway).
MAX_SAMPLE_QUEUES: Final = 10_000
MAX_SAMPLE_FLOWS: Final = 10_000
SAMPLE_QUEUES: Final = 100
SAMPLE_FLOWS: Final = 256
