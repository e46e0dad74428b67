"""Healthy: ``model.fit`` writing a checkpoint every "epoch" into its logdir and keeping the
newest three.

``fit_checkpoints_fill_disk`` fixed: the same 1.4-MB checkpoint every 0.25 s of training,
by a ``tf.train.CheckpointManager`` with ``max_to_keep=3``, which removes each older than the
newest three as the next is written. The logdir's filesystem
(a 512-MiB tmpfs in the e2e tests) holds about 4 MB throughout: a level, not a leak.

python scenarios/healthy_fit_checkpoints_keep_three.py [--seconds 20]
"""

from __future__ import annotations

from fit_checkpoints_fill_disk import train

if __name__ == "__main__":
    train(keep=3)
