# The image of deploy/kubernetes/daemonset.yaml: the node daemon, without TensorFlow (it
# reads other processes' /proc, hook channels and event files; tensorboard parses those).
#   docker build -t ghcr.io/driftwatch/driftwatch:0.1.0 .
FROM python:3.11-slim
COPY . /src
RUN pip install --no-cache-dir "/src[gpu]" "tensorboard>=2.16" && rm -rf /src
ENTRYPOINT ["driftwatch"]
CMD ["daemon", "--listen", "0.0.0.0:19461"]
