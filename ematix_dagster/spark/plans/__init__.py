"""What a run plans once, at start: its SQL analysed and guarded, and each window kind's partial
aggregation in Spark."""
