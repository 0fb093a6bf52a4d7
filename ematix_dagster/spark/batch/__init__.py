"""One micro-batch: the batch step every pipeline shape shares, each shape's engine call, and what a batch
reports."""
