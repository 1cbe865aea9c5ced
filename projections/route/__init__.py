"""The route procedure (behavior.md §3.5–§10) as a fold, split by phase; the entry point is `projections.fold`."""
