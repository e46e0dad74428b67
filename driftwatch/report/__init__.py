"""What happened in a run, from the history: ``driftwatch report``.

``build`` reads one run and turns it into the model (``model``): panels of the signals a
person looks at first, each with its trend or projection, summaries of every series, and the
findings. The text (``text``), JSON (``json``) and HTML (``html``) renderings only format it.
"""
