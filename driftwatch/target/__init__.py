"""The watched process: identified by pid and create time, named across PID namespaces."""
