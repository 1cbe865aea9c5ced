"""The webhook door: the HTTP server, its Kafka producer and its health."""
