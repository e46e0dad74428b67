"""One watched run: the monitor that feeds samples to the store and the detectors, and the
snapshots it publishes to sinks."""
