"""Evidence captured at drift: stack dumps (py-spy) and TensorFlow Profiler traces (from the
hook), stored beside the history with size caps. See docs/capture.md."""
