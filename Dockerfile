# One image for every role of docker-compose.yml; the same setup as `make setup`.
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends make nodejs npm && rm -rf /var/lib/apt/lists/*
WORKDIR /rollnet
COPY . .
RUN make setup && ln -s /rollnet/.venv/bin/rollnet /usr/local/bin/rollnet \
    && ln -s "$(ls -d /rollnet/node_modules/@foundry-rs/anvil-linux-*/bin/anvil)" /usr/local/bin/anvil
ENV OMP_NUM_THREADS=1
