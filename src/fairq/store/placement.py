"""Where an environment's runs live: how many partitions it has, as recorded on the server.

An environment spread over ``S`` partitions (see :mod:`fairq.keys`) is listed in the
placement record ``<prefix>:placement`` (``E`` -> ``"S"``, or ``"S:D"`` while the
partitions ``S .. D-1`` of an earlier, larger layout still drain). An environment not
listed has one partition: today's layout, with no key of its own.

Every process keeps the whole record in memory and reads it again (one ``HGETALL``)
when its copy is older than :data:`PLACEMENT_REFRESH_S`. A process whose copy is stale
after a change still places its runs in partitions that exist and are served: the
partitions of a smaller layout are the first ones of a larger, and a shrunk layout keeps
serving its old partitions until they are drained.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from fairq.keys import tenant_partition

#: How old a process's copy of the placement record may grow before it is read again (s).
PLACEMENT_REFRESH_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class Placement:
    """An environment's partitions.

    Attributes:
        partitions: where new runs go (1 = the environment's shard alone).
        draining: partitions of an earlier, larger layout that may still hold runs (0 when
            none); consumers and readers cover ``max(partitions, draining)``.
    """

    partitions: int = 1
    draining: int = 0

    @property
    def served(self) -> int:
        """How many partitions consumers serve and readers sum."""
        return max(self.partitions, self.draining)

    def partition_of(self, encoded_tenant: str, encoded_ck: str) -> int:
        """The partition a run of this tenant (or key) goes to."""
        return tenant_partition(encoded_tenant, encoded_ck, self.partitions)

    def encode(self) -> str:
        """The record's value for this placement."""
        if self.draining > self.partitions:
            return f"{self.partitions}:{self.draining}"
        return str(self.partitions)


#: One partition: the layout of every environment the record does not list.
SINGLE: Final = Placement()


def parse_placement(raw: str) -> Placement:
    """A record value (``"S"``, or ``"S:D@T"`` after a shrink at T) as a Placement; a
    value fairq did not write counts as one partition (and is overwritten by the next
    change)."""
    head, _, drain = raw.partition("@")[0].partition(":")
    try:
        partitions, draining = int(head), int(drain or 0)
    except ValueError:
        return SINGLE
    if partitions < 1 or draining < 0:
        return SINGLE
    return Placement(partitions, draining if draining > partitions else 0)


class PlacementCache:
    """A process's copy of the placement record."""

    def __init__(self) -> None:
        self._known: dict[str, Placement] = {}
        self._loaded_at: float | None = None

    def fresh(self, now: float) -> bool:
        """Whether the copy was read less than PLACEMENT_REFRESH_S before ``now``."""
        return self._loaded_at is not None and now - self._loaded_at < PLACEMENT_REFRESH_S

    def get(self, env_id: str) -> Placement:
        return self._known.get(env_id, SINGLE)

    def load(self, record: Mapping[Any, Any], now: float) -> None:
        """Replace the copy with a record read at ``now`` (bytes or str fields)."""
        known = {}
        for field, value in record.items():
            env_id = field.decode() if isinstance(field, bytes) else str(field)
            text = value.decode() if isinstance(value, bytes) else str(value)
            placement = parse_placement(text)
            if placement != SINGLE:
                known[env_id] = placement
        self._known = known
        self._loaded_at = now

    def remember(self, env_id: str, placement: Placement) -> None:
        """This process changed an environment's placement: use it at once."""
        if placement == SINGLE:
            self._known.pop(env_id, None)
        else:
            self._known[env_id] = placement

    def spread(self) -> dict[str, Placement]:
        """The environments known to have several partitions (or draining ones)."""
        return dict(self._known)
