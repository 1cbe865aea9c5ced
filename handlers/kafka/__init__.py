"""Kafka plumbing: topics and their settings, topic I/O, retries, the configuration store."""
