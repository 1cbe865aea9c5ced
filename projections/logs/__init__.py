"""Pure steps of the log readers: the scan, audit trails, rebuilds, verification, versions."""
