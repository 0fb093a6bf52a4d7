"""What a failure means to an operator: classified errors, and Spark's own report kept off the terminal."""
