"""What the batches read: the managed input files, the dead letters of files left out, and Spark's
checkpoint of what was read."""
