"""The channel: how the in-process hook hands its records to a monitor in another process.

- ``driftwatch.channel.paths``: where channel files live and how they are named;
- ``driftwatch.channel.ring``: the shared-memory ring a hook writes and a monitor reads;
- ``driftwatch.channel.wire``: what the records mean (kinds, metadata keys);
- ``driftwatch.channel.env``: the environment variables shared by the launcher, the hook and
  the monitors.

Stdlib only, and importing this package imports none of them: the hook imports the channel
inside the training process, the monitoring side imports it without TensorFlow, and the
channel imports neither.
"""
