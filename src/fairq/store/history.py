"""A queue's history as the scripts write it and the readers read it.

Two records per base queue (see :mod:`fairq.keys`): 10-second buckets of counters
(``B:h:<bucket>``, a hash per bucket, kept a while) and the recent list of finished runs
(``B:recent``, one line per run, newest first, bounded). The constants below are their
one definition; the loader generates the Lua side from them (:mod:`fairq.store.shared`).
"""

from __future__ import annotations

from typing import Final

from fairq.outcomes import FINISH_STATUSES

#: Width of one history bucket (ms).
HISTORY_BUCKET_MS: Final = 10_000
#: The longest window a reader asks for (ms).
HISTORY_WINDOW_MS: Final = 3_600_000
#: How long a bucket is kept (s): the longest window and five minutes more.
HISTORY_TTL_S: Final = HISTORY_WINDOW_MS // 1000 + 300
#: Most fields one bucket holds before new tenants are counted together.
HISTORY_MAX_FIELDS: Final = 256
#: A bucket's field counting the runs served to one tenant: this prefix and the tenant.
HISTORY_TENANT_PREFIX: Final = "t:"
#: The field counting the tenants a full bucket has no field for.
HISTORY_OVERFLOW_FIELD: Final = HISTORY_TENANT_PREFIX + "~"
#: A bucket hash (history or shares) of this many fields or more gets one more field,
#: ``WIDE_FIELD``, whose value is longer than a server keeps in a compact hash (64 bytes by
#: default): the server then keeps the hash as a hash table, where a field costs the same
#: whatever the hash holds. Kept compact (a list the server scans field by field, up to
#: 512 fields on Valkey 9), a bucket of a few hundred tenants or flows cost every finish
#: and serve a scan of all of them. The value reads as the number 0 for every reader.
WIDE_AT: Final = 32
WIDE_FIELD: Final = "~wide"
WIDE_VALUE: Final = "0." + "0" * 64
#: A bucket's counters: runs served and their summed wait (ms), runs finished by how,
#: retried, dead-lettered, expired, and the summed run time (ms) of finished runs.
HISTORY_COUNTERS: Final = (
    "served", "wait_ms", *FINISH_STATUSES, "retried", "dead_lettered", "expired", "run_ms",
)  # fmt: skip

#: One line of the recent list: these fields, space-separated, in this order (status,
#: finished at (ms), attempts, run time (ms; '' when it never started), encoded key,
#: encoded tenant ('' = none); encoded names hold no spaces, and the run id comes last).
RECENT_FIELDS: Final = ("status", "finished_at", "attempts", "run_ms", "ck", "tenant", "run_id")
