"""One worker of a small MultiWorkerMirroredStrategy job: a custom loop with strategy.run, on CPU.

The tests start 2 of these (under ``driftwatch run`` each), with ``TF_CONFIG`` naming
127.0.0.1 ports and this worker's ``task``. Knobs, from the environment:

- ``MW_SECONDS``: train about this long (default 20). Every 50 steps the workers agree to stop
  with an all-reduce, so all of them run the same number of steps (a collective job must).
- ``MW_SLEEP_MS``: per-sample sleep in this worker's input ``map`` (a slow input pipeline; 1 ms
  on a 32-sample batch is ~35 ms a step). Default 0.
- ``MW_BATCH`` (per worker, default 32), ``MW_WIDTH`` (hidden units, default 64; 1024 with a
  batch of 128 makes compute, not the loopback collective, a large part of the step, for the
  CPU-contention case).
- ``MW_LOOP``: ``in`` (default): ``next(iterator)`` inside the ``tf.function`` (the TensorFlow
  tutorial's form); ``out``: ``for batch in dist_dataset`` in Python, the step takes the batch.

Prints one JSON line when done: rank, steps, seconds to create the strategy (it waits for every
worker), seconds to the first step, median step time.
"""

import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras
import tensorflow as tf

SECONDS = float(os.environ.get("MW_SECONDS", "20"))
SLEEP = float(os.environ.get("MW_SLEEP_MS", "0")) / 1000.0
BATCH = int(os.environ.get("MW_BATCH", "32"))
WIDTH = int(os.environ.get("MW_WIDTH", "64"))
LOOP = os.environ.get("MW_LOOP", "in")
rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]

t_start = time.time()
strategy = tf.distribute.MultiWorkerMirroredStrategy()
t_strategy = time.time()


def make_dataset(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
    x = tf.random.stateless_uniform((4096, 32), seed=(1, ctx.input_pipeline_id))
    y = tf.reduce_sum(x, axis=1, keepdims=True)
    batch = ctx.get_per_replica_batch_size(BATCH * ctx.num_input_pipelines)
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    if SLEEP <= 0:  # batches made once: the step never waits for them
        return ds.batch(batch, drop_remainder=True).cache().repeat().prefetch(2)

    def slow(a: tf.Tensor, b: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        tf.py_function(lambda: time.sleep(SLEEP), [], [])
        return a, b

    return ds.repeat().map(slow).batch(batch).prefetch(2)


with strategy.scope():
    model = keras.Sequential(
        [
            keras.Input((32,)),
            keras.layers.Dense(WIDTH, activation="relu"),
            keras.layers.Dense(WIDTH, activation="relu"),
            keras.layers.Dense(1),
        ]
    )
    optimizer = keras.optimizers.SGD(0.001)

dist_ds = strategy.distribute_datasets_from_function(make_dataset)


def step_fn(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return loss


if LOOP == "in":

    @tf.function
    def train_step(iterator):  # type: ignore[no-untyped-def]
        loss = strategy.run(step_fn, args=next(iterator))
        return strategy.reduce("SUM", loss, axis=None)

else:

    @tf.function
    def train_step(batch):  # type: ignore[no-untyped-def]
        loss = strategy.run(step_fn, args=batch)
        return strategy.reduce("SUM", loss, axis=None)


@tf.function  # type: ignore[untyped-decorator]
def any_worker_done(flag: tf.Tensor) -> tf.Tensor:
    """SUM of the workers' 'my time is up' flags (ReduceOp has no MAX): > 0 stops all of them."""
    return strategy.reduce("SUM", strategy.run(lambda: tf.identity(flag)), axis=None)


iterator = iter(dist_ds)
steps, t_first, times = 0, 0.0, []
while True:
    t0 = time.perf_counter()
    loss = train_step(next(iterator) if LOOP == "out" else iterator)
    times.append(time.perf_counter() - t0)
    steps += 1
    if steps == 1:
        t_first = time.time()
    if steps % 50 == 0:
        done = tf.constant(float(time.time() - t_first > SECONDS))
        if float(any_worker_done(done)) > 0:
            break
steady = sorted(times[20:]) or times
summary = {
    "rank": rank,
    "steps": steps,
    "strategy_s": round(t_strategy - t_start, 2),
    "first_step_s": round(t_first - t_strategy, 2),
    "median_step_ms": round(1000 * steady[len(steady) // 2], 2),
    "loss": round(float(loss), 4),
}
print(json.dumps(summary), flush=True)
