"""The embedded history: each run's metadata, downsampled series and findings, in SQLite.

``schema``: the tables, and opening a database to write or to read; ``writer``: the writer
thread (``History``) and each run's recorder, a monitor's sink (``RunRecorder``);
``reader``: reading runs back (``HistoryReader``), for ``driftwatch report``.
"""
