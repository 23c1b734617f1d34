# syntax=docker/dockerfile:1.7
# Two images from one build: `docker build --target runner .` and `docker build --target bot .`
FROM python:3.11-slim AS source
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protos protos
COPY kernel kernel
COPY runner runner
COPY bot bot
COPY vllm_sim vllm_sim
COPY demo demo

# Each image installs its own product over the kernel: the runner's has no Slack, the bot's no NVML or Docker SDK.
FROM source AS build-runner
RUN python -m venv /opt/k3repro && /opt/k3repro/bin/pip install '.[runner]'

FROM source AS build-bot
RUN python -m venv /opt/k3repro && /opt/k3repro/bin/pip install '.[bot]'

FROM python:3.11-slim AS base
RUN useradd --system --uid 10001 --create-home --home-dir /var/lib/k3repro k3repro
ENV PATH=/opt/k3repro/bin:$PATH PYTHONUNBUFFERED=1
WORKDIR /var/lib/k3repro

# The runner launches engines through the host's Docker socket (mount /var/run/docker.sock and add the
# socket's group) or as processes; NVML needs the NVIDIA runtime (`--gpus all` or runtimeClassName nvidia).
FROM base AS runner
COPY --from=build-runner /opt/k3repro /opt/k3repro
USER k3repro
EXPOSE 50051
ENTRYPOINT ["k3repro-runner"]
CMD ["serve", "--config", "/etc/k3repro/runner.toml"]

# The bot reads the isolation templates from here ([isolation] script, job_template in k3repro.toml).
FROM base AS bot
COPY --from=build-bot /opt/k3repro /opt/k3repro
COPY deploy/slurm /opt/k3repro/deploy/slurm
COPY deploy/k8s/isolated-runner-job.yaml /opt/k3repro/deploy/k8s/
USER k3repro
EXPOSE 3000
ENTRYPOINT ["k3repro-bot"]
# `--config` may come before or after `serve`; add `--check-config` to check the file and exit.
CMD ["serve", "--config", "/etc/k3repro/k3repro.toml"]
