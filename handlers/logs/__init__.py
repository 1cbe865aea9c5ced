"""Readers of the event log: one reader, progress, shards, audit, what-if, rebuilds."""
