"""What the job's TensorBoard event files and its in-process hook say: steps, epochs, TF memory,
tracing and non-finite values (driftwatch/sources/eventfiles.py, scalars.py, hook.py)."""

from __future__ import annotations

from driftwatch.series.spec import RUNTIME_LABELS, Export, MetricType, SeriesSpec

TRAINING: dict[str, SeriesSpec] = {
    # TensorBoard event files
    "event_files": SeriesSpec("driftwatch_event_files", "TensorBoard event files of the run."),
    "event_file_bytes": SeriesSpec(
        "driftwatch_event_file_bytes", "Total size of the run's TensorBoard event files."
    ),
    "event_file_largest_bytes": SeriesSpec(
        "driftwatch_event_file_largest_bytes",
        "Size of the run's largest single TensorBoard event file.",
    ),
    "event_file_unread_bytes": SeriesSpec(
        "driftwatch_event_file_unread_bytes",
        "Bytes of the run's event files a tick left unread: 0 unless reading falls behind.",
    ),
    "train_step": SeriesSpec("driftwatch_train_step", "Latest training step seen."),
    "step_timestamp": SeriesSpec(
        "driftwatch_last_step_timestamp_seconds",
        "Wall-clock time at which the latest training step was logged.",
    ),
    "step_seconds": SeriesSpec(
        "driftwatch_step_duration_seconds",
        "Median wall-clock time per training step over the recent window.",
        export=Export.RECENT_MEDIAN,
    ),
    # the in-process hook
    "runtime_info": SeriesSpec(
        "driftwatch_runtime_info",
        "Versions the target runs, from its hook: Python, TensorFlow and Keras (empty: not "
        "imported); always 1.",
        label_names=RUNTIME_LABELS,
    ),
    "step_gap_seconds": SeriesSpec(
        "driftwatch_step_gap_seconds",
        "Median seconds per step spent outside the train step (callbacks, host work).",
        export=Export.RECENT_MEDIAN,
    ),
    "input_wait_share": SeriesSpec(
        "driftwatch_input_wait_ratio",
        "Share of step time the job spent waiting for its next batch from tf.data, over the "
        "hook's steps since its previous probe (custom loops; fit, evaluate, predict).",
    ),
    "input_wait_batch_seconds": SeriesSpec(
        "driftwatch_input_wait_batch_seconds",
        "Median wait for one batch from tf.data over the newest batches (at most 128) since "
        "the hook's previous probe (custom loops).",
    ),
    "collective_wait_share": SeriesSpec(
        "driftwatch_collective_wait_ratio",
        "Share of step time this rank of a multi-worker job spent in its collectives (the "
        "strategy's all-reduces) waiting for the other ranks, over the hook's steps since its "
        "previous probe (custom loops); the rank the others wait for waits least.",
    ),
    "peer_collective_wait_share": SeriesSpec(
        "driftwatch_peer_collective_wait_ratio",
        "The newest collective wait share (driftwatch_collective_wait_ratio) of another rank "
        "of this run on this node (label peer), as its monitor posted it: what this rank is "
        "compared with.",
        label_names=("peer",),
    ),
    "epoch_seconds": SeriesSpec(
        "driftwatch_epoch_duration_seconds", "Wall-clock duration of the latest epoch."
    ),
    "validation_seconds": SeriesSpec(
        "driftwatch_validation_duration_seconds",
        "Wall-clock time the latest epoch spent in validation.",
    ),
    "tf_allocator_current_bytes": SeriesSpec(
        "driftwatch_tf_allocator_current_bytes",
        "Memory TensorFlow's allocator has in use on a device.",
        label_names=("device",),
    ),
    "tf_allocator_peak_bytes": SeriesSpec(
        "driftwatch_tf_allocator_peak_bytes",
        "Peak memory TensorFlow's allocator has had in use on a device.",
        label_names=("device",),
    ),
    "tracing_count": SeriesSpec(
        "driftwatch_tf_function_traces_total",
        "Times TensorFlow traced the watched train functions again after driftwatch first "
        "read them (retracing when it keeps rising).",
        MetricType.COUNTER,
    ),
    "retracing_warnings_total": SeriesSpec(
        "driftwatch_tf_retracing_warnings_total",
        "TensorFlow retracing warnings the job printed (driftwatch run only).",
        MetricType.COUNTER,
    ),
    "hook_nonfinite_total": SeriesSpec(
        "driftwatch_hook_nonfinite_values_total",
        "Non-finite (NaN or infinite) losses, metrics or weights the hook has seen.",
        MetricType.COUNTER,
    ),
    "nonfinite_by_name_total": SeriesSpec(
        "driftwatch_nonfinite_values_by_name_total",
        "Non-finite values by what held them: the hook's checked name (loss, a metric, a "
        "weight) or an event-file tag, and its role (loss, metric or weights).",
        MetricType.COUNTER,
        label_names=("name", "role"),
    ),
    "hook_records_lost_total": SeriesSpec(
        "driftwatch_hook_records_lost_total",
        "Hook records overwritten before driftwatch read them (the reader fell behind).",
        MetricType.COUNTER,
    ),
    "nonfinite_total": SeriesSpec(
        "driftwatch_nonfinite_values_total",
        "Non-finite (NaN or infinite) scalar values seen in the run's logs.",
        MetricType.COUNTER,
    ),
}


MAX_NONFINITE_NAMES = 16
"""Names whose non-finite values are counted apart; later ones count as ``(others)``."""


def nonfinite_role(name: str) -> str:
    """The role of a non-finite value known by name only (a logged or returned scalar): the
    loss if its name says so (``loss``, ``val_loss``, ``epoch_loss``, ``train/loss``) or it is
    an unnamed output of a train step (``train_step_output``, ``train_step_output[0]``: a
    NaN loss is never passed off as a metric), else a metric."""
    lowered = name.lower()
    return "loss" if "loss" in lowered or lowered.startswith("train_step_output") else "metric"
