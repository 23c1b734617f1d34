# syntax=docker/dockerfile:1.7
# Two images from one build: `docker build --target runner .` and `docker build --target bot .`
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protos protos
COPY runner runner
COPY bot bot
RUN python -m venv /opt/k3repro && /opt/k3repro/bin/pip install .

FROM python:3.11-slim AS base
RUN useradd --system --uid 10001 --create-home --home-dir /var/lib/k3repro k3repro
COPY --from=build /opt/k3repro /opt/k3repro
ENV PATH=/opt/k3repro/bin:$PATH PYTHONUNBUFFERED=1
WORKDIR /var/lib/k3repro

# The runner launches engines through the host's Docker socket (mount /var/run/docker.sock and add the
# socket's group) or as processes; NVML needs the NVIDIA runtime (`--gpus all` or runtimeClassName nvidia).
FROM base AS runner
USER k3repro
EXPOSE 50051
ENTRYPOINT ["k3repro-runner"]
CMD ["serve", "--config", "/etc/k3repro/runner.toml"]

FROM base AS bot
USER k3repro
ENTRYPOINT ["k3repro-bot"]
CMD ["serve", "--config", "/etc/k3repro/k3repro.toml"]
