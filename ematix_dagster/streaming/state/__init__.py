"""The driver state of each window kind behind one interface (``base.KindState``): ``fixed``
(tumbling, hopping), ``session`` and ``sliding``, with the order of rows they share (``order``)."""
