# One image for every role of docker-compose.yml; the same setup as `make setup`, plus the embedded base
# model built once into the image, so every container of a run holds the same version-0 weights.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends make nodejs npm && rm -rf /var/lib/apt/lists/*
WORKDIR /rollnet
COPY . .
RUN make setup && ln -s /rollnet/.venv/bin/rollnet /usr/local/bin/rollnet \
    && ln -s "$(ls -d /rollnet/node_modules/@foundry-rs/anvil-linux-*/bin/anvil)" /usr/local/bin/anvil \
    && rollnet --data-dir /opt/rollnet model init \
    && ln -s "$(ls -d /opt/rollnet/models/addition-2digit-*)" /opt/rollnet/base-model
ENV OMP_NUM_THREADS=1
