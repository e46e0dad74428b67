"""A non-finite value is named, and worded by what held it: the loss or weights (a diverged
run) or only a metric (the metric's own 0/0, training finite)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from driftwatch.series.training import nonfinite_role
from tests.conftest import TF_ENV, run_cli

RECALL_NAN_FIT = """
    import keras, numpy as np

    def recall(y_true, logits):  # 0/0 = NaN on a batch without positives
        predicted = keras.ops.cast(logits > 0.0, "float32")
        return keras.ops.sum(y_true * predicted) / keras.ops.sum(y_true)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2048, 8)).astype("float32")
    y = np.zeros((2048, 1), "float32")
    y[:1024:4] = 1.0  # positives in the first half only: later batches of 64 hold none
    x[:, 0] += y[:, 0]
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile("sgd", keras.losses.BinaryCrossentropy(from_logits=True), metrics=[recall])
    history = model.fit(x, y, batch_size=64, epochs=3, shuffle=False, verbose=0)
    print("last loss", history.history["loss"][-1], "last recall", history.history["recall"][-1])
"""

NAN_LOSS_HOOK = """
    import time
    import driftwatch

    hook = driftwatch.Hook()
    for _ in range(50):
        with hook.step():
            time.sleep(0.01)
    hook.check_finite(float("nan"))  # the loss, as a custom loop checks it
    time.sleep(1.5)
"""


def run_job(
    tmp_path: Path, source: str
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]:
    """``driftwatch run`` with its defaults on ``source``; its output and findings."""
    program = tmp_path / "job.py"
    program.write_text(textwrap.dedent(source), encoding="utf-8")
    findings = tmp_path / "findings.jsonl"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "driftwatch", "run", "--findings", str(findings)),
            *("--db", str(tmp_path / "history.db"), "--listen", "127.0.0.1:0"),
            *("--", sys.executable, str(program)),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={**os.environ, **TF_ENV},
    )
    lines = findings.read_text(encoding="utf-8").splitlines() if findings.exists() else []
    return result, [json.loads(line) for line in lines if '"nonfinite"' in line]


@pytest.mark.tf
@pytest.mark.paired
def test_a_metric_that_divides_by_zero_is_named_and_not_called_divergence(
    tmp_path: Path,
) -> None:
    """Expected: recall is NaN in the 16 later batches of each of 3 epochs (48 of 96), the
    loss stays finite (about 0.6): one warning naming recall, no divergence advice."""
    result, found = run_job(tmp_path, RECALL_NAN_FIT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "last recall nan" in result.stdout
    assert found, result.stdout[-3000:]
    last = found[-1]
    assert last["severity"] == "warning"
    assert last["evidence"]["nonfinite_in"] == "metric"
    assert last["evidence"]["nonfinite_names"] == "recall"
    assert "only in metrics: recall" in last["message"]
    # The findings file has the finding as first told (however many batches had come by
    # that tick); the history has it as the whole run left it.
    report = run_cli("report", "--db", str(tmp_path / "history.db"), "--json")
    (stored,) = [f for f in json.loads(report.stdout)["findings"] if f["kind"] == "nonfinite"]
    assert stored["evidence"]["nonfinite_values[recall]"] >= 16
    assert "diverged" not in last["message"]
    assert "[warning] nonfinite" in result.stdout  # the summary says the same


def test_a_nan_loss_is_named_and_still_called_divergence(tmp_path: Path) -> None:
    result, found = run_job(tmp_path, NAN_LOSS_HOOK)
    assert result.returncode == 0, result.stderr[-3000:]
    assert found, result.stdout[-3000:]
    last = found[-1]
    assert last["severity"] == "critical"
    assert last["evidence"]["nonfinite_in"] == "loss"
    assert "by the hook since" in last["message"]
    assert " in loss (1): training has likely diverged" in last["message"]


def test_only_a_named_metric_is_a_metric_and_an_unnamed_step_output_counts_as_the_loss() -> None:
    roles = {name: nonfinite_role(name) for name in NAMES}
    assert roles == NAMES


NAMES = {
    "loss": "loss",
    "val_loss": "loss",
    "train/epoch_loss": "loss",
    "train_step_output": "loss",
    "train_step_output[0]": "loss",
    "recall": "metric",
    "val_accuracy": "metric",
    "train/epoch_auc": "metric",
}
"""Names the hook or event files report, and the role each gets."""
