"""Which configuration version each partition is folded under (DESIGN §8 "Configuration is an event").

Every reader of the log that folds it (audits, the console, rebuilds, what-if) switches a partition's version
where its `ConfigApplied` marker is, exactly as the worker does; this is that bookkeeping, once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.configs import ConfigBook, ConfigDocument
from schemas.keys import partition_slot
from schemas.records import parse_marker


@dataclass
class PartitionVersions:
    """The last marker's version per partition slot ("conversations:3"), for the documents of `book`."""

    book: ConfigBook
    slots: dict[str, str] = field(default_factory=dict)
    markers: int = 0

    def switch(self, value: bytes | None, partition: int, topic: str = "conversations") -> bool:
        """Fold `value` if it is a marker (True: it is not an event); a version the book lacks is ignored."""
        marker = parse_marker(value)
        if marker is None:
            return False
        self.markers += 1
        if marker.version in self.book:
            self.slots[partition_slot(topic, partition)] = marker.version
        return True

    def document(self, partition: int, topic: str = "conversations") -> ConfigDocument | None:
        """The document in force for the partition's next record (the book's first before any marker)."""
        return self.book.in_force(self.slots.get(partition_slot(topic, partition)))
