"""The local Kafka for development and tests: one node or a three-node cluster."""
