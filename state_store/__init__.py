"""Durable window state (in-memory, SQLite, PostgreSQL) — arrives with the StateStore issue.

Until then the engine keeps window state on the driver and refuses to resume from an existing
checkpoint, so no state is ever lost silently.
"""
