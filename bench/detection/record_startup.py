"""Record how a real TensorFlow program's resident memory behaves from its first second.

Runs one program (``PROGRAMS``) and reads ``/proc/<pid>/status`` every 0.5 s, as driftwatch
samples a young target, writing the readings as a samples file that ``driftwatch analyze``
and the unit tests replay: one JSON line per reading and series,
``{"t": <unix seconds>, "series": "rss_bytes", "value": <bytes>}``, after one
``memory_limit_bytes`` line (the host's memory). ``--fields`` also records what the process
source reads beside ``VmRSS``: ``RssAnon``, ``RssFile``, ``RssShmem``, threads, CPU time and
bytes read (``rchar``); ``--busy N`` pins the program to one CPU with N processes spinning
beside it (a host N + 1 times as busy). Run from the repository root::

    .venv/bin/python bench/detection/record_startup.py custom_loop tests/data/startup/x.jsonl

The recordings in ``tests/data/startup/`` were made so, one program at a time, on the
shared 2-vCPU VM (other work running beside them: start-ups as slow as on a busy host);
those with the other fields are in ``tests/data/startup/fields/``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TICK_SECONDS = 0.5
"""Seconds between two readings: driftwatch's sampling interval for a young target."""

CUSTOM_LOOP = """
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import time
import numpy as np
import tensorflow as tf
x = np.random.default_rng(0).normal(size=(4096, 32)).astype("float32")
y = x.sum(axis=1, keepdims=True)
data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(4096).batch(32).repeat()
model = tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(64, "relu"),
                             tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.Adam()
@tf.function
def train_step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2)
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                  model.trainable_variables))
    return loss
deadline = time.monotonic() + SECONDS
for xb, yb in data:
    loss = train_step(xb, yb)
    if time.monotonic() > deadline:
        break
print(float(loss))
"""

CNN_FIT = """
import os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import time
import numpy as np
import keras
rng = np.random.default_rng(0)
x = rng.normal(size=(2048, 28, 28, 1)).astype("float32")
y = rng.integers(0, 10, size=2048)
layers = keras.layers
model = keras.Sequential([keras.Input((28, 28, 1)), layers.Conv2D(16, 3, activation="relu"),
                          layers.MaxPooling2D(), layers.Conv2D(32, 3, activation="relu"),
                          layers.Flatten(), layers.Dense(10)])
model.compile(optimizer="adam", metrics=["accuracy"],
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
deadline = time.monotonic() + SECONDS
class Budget(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if time.monotonic() > deadline:
            self.model.stop_training = True
model.fit(x, y, batch_size=64, epochs=100, validation_split=0.2, verbose=0, callbacks=[Budget()])
"""

KEPT_OUTPUTS = CUSTOM_LOOP.replace(
    "    loss = train_step(xb, yb)\n",
    "    loss = train_step(xb, yb)\n    kept.append(tf.tile(xb, [1, 16]))\n",
).replace("deadline = ", "kept = []\ndeadline = ")

PYTHON_FLOAT_LR = (
    CUSTOM_LOOP.replace("def train_step(xb, yb):", "def train_step(xb, yb, lr):")
    .replace(
        "    loss = train_step(xb, yb)\n",
        "    lr = 0.999 * lr\n    loss = train_step(xb, yb, lr)\n",
    )
    .replace("deadline = ", "lr = 0.01\ndeadline = ")
)

PROGRAMS = {
    "train_keras": ["driftwatch/examples/train_keras.py", "--epochs", "1000", "--seconds"],
    "custom_loop": ["-c", CUSTOM_LOOP],
    "cnn_fit_validation": ["-c", CNN_FIT],
    "kept_outputs": ["-c", KEPT_OUTPUTS],
    "python_float_lr": ["-c", PYTHON_FLOAT_LR],
    **{
        f"scenario_{name}": [f"scenarios/{name}.py", "--seconds"]
        for name in (
            "fit_validation_tensorboard",
            "healthy_fit_validation",
            "healthy_fit_cache",
            "healthy_loop",
            "healthy_custom_train_step",
        )
    },
}
"""Healthy programs: Keras ``fit`` with TensorBoard and a validation split (the project's
control example), a ``tf.function`` + ``GradientTape`` loop with no TensorBoard, and a
small CNN's ``fit`` with a validation split; leaking ones: that loop keeping a 64 KiB tensor
per batch in a list, and passing a decaying learning rate as a Python float (a new trace
each step). ``scenario_*``: programs of the failure suite (``scenarios/``), run with one
TensorFlow thread as its e2e test runs them (``SCENARIO_ENV``)."""

SCENARIO_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "", "PYTHONUNBUFFERED": "1"}
SCENARIO_ENV |= {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
"""Environment of a ``scenario_*`` program: the e2e test's (tests/test_scenarios_e2e.py)."""


def command(name: str, seconds: float) -> list[str]:
    program = PROGRAMS[name]
    if program[0] == "-c":
        return [sys.executable, "-c", f"SECONDS = {seconds}\n" + program[1]]
    return [sys.executable, *program, str(seconds)]


STATUS_FIELDS = {
    "VmRSS": "rss_bytes",
    "RssAnon": "rss_anon_bytes",
    "RssFile": "rss_file_bytes",
    "RssShmem": "rss_shmem_bytes",
}
"""``/proc/<pid>/status`` fields (kB) recorded, and the series they are."""


def readings(pid: int, fields: bool) -> dict[str, float]:
    """The series read from ``/proc/<pid>`` now (``rss_bytes`` only unless ``fields``)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
        io = Path(f"/proc/{pid}/io").read_text() if fields else ""
    except OSError:
        return {}
    values: dict[str, float] = {}
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key in STATUS_FIELDS and (fields or key == "VmRSS"):
            values[STATUS_FIELDS[key]] = float(value.split()[0]) * 1024
        elif key == "Threads" and fields:
            values["threads"] = float(value)
    if fields:
        ticks = stat.rsplit(")", 1)[1].split()
        values["cpu_seconds"] = (int(ticks[11]) + int(ticks[12])) / os.sysconf("SC_CLK_TCK")
        for line in io.splitlines():
            if line.startswith("rchar:"):
                values["read_syscall_bytes"] = float(line.split()[1])
    return values


def host_memory_bytes() -> float:
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


SPIN = "while True:\n    pass\n"
"""What each process spinning beside the program runs."""


def record(name: str, seconds: float, out: Path, *, fields: bool = False, busy: int = 0) -> int:
    """Run program ``name`` for about ``seconds`` of training; write its readings to ``out``
    and print the program's last line of output (a scenario's ``done`` line: its steps)."""
    pin = ["taskset", "-c", "0"] if busy else []
    env = {**os.environ, **SCENARIO_ENV} if name.startswith("scenario_") else None
    spinners = [subprocess.Popen([*pin, sys.executable, "-c", SPIN]) for _ in range(busy)]
    try:
        with tempfile.TemporaryFile("w+") as said:
            started = time.time()
            process = subprocess.Popen([*pin, *command(name, seconds)], stdout=said, env=env)
            host = host_memory_bytes()
            lines = [{"t": round(started, 3), "series": "memory_limit_bytes", "value": host}]
            tick = time.monotonic()
            while process.poll() is None:
                values = readings(process.pid, fields)
                now = round(time.time(), 3)
                if values.get("rss_bytes", 0.0) > 0:
                    lines += [{"t": now, "series": k, "value": v} for k, v in values.items()]
                tick += TICK_SECONDS
                time.sleep(max(0.0, tick - time.monotonic()))
            said.seek(0)
            print(*said.read().splitlines()[-1:])
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return process.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("program", choices=sorted(PROGRAMS))
    parser.add_argument("out", type=Path, help="samples file to write (JSON lines)")
    parser.add_argument("--seconds", type=float, default=25.0, help="training time (default 25)")
    parser.add_argument(
        "--fields", action="store_true", help="also RssAnon, RssFile, RssShmem, threads, CPU"
    )
    parser.add_argument("--busy", type=int, default=0, help="processes spinning on its CPU")
    args = parser.parse_args()
    code = record(args.program, args.seconds, args.out, fields=args.fields, busy=args.busy)
    if code != 0:
        print(f"{args.program} exited with status {code}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
