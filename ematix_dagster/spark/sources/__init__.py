"""Spark's streaming sources as the spec names them: files, Kafka and Redis, and message payloads."""
