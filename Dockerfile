# syntax=docker/dockerfile:1
#
# pilot discovery in a container.
#
#   docker build -t pilot .
#   docker run --rm -p 15010:15010 -p 15014:15014 pilot --config /etc/pilot/mesh.yaml \
#       --insecure-bind-any
#
# (With --config streams are trusted by their node metadata, so pilot listens on loopback
# only unless --insecure-bind-any says otherwise; in a container, loopback is unreachable.)
#
# Stage 1 builds the wheel of pilot and of everything it depends on, resolved once.
# Stage 2 installs them from a build-time mount: no compiler, no pip cache and no wheel
# file ends up in any layer of the image. The final image runs as uid 1337 with its only
# writable path (/var/lib/pilot, where a self-signed CA root is kept outside Kubernetes)
# owned by that user; in Kubernetes the root filesystem is read-only and an emptyDir is
# mounted there (deploy/deployment.yaml).

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY pilot ./pilot
RUN pip wheel --no-cache-dir --disable-pip-version-check --wheel-dir /wheels .

FROM python:3.11-slim
LABEL org.opencontainers.image.title="pilot" \
      org.opencontainers.image.description="An asyncio xDS/SDS control plane for Envoy, with Istio's conventions" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    XDG_STATE_HOME=/var/lib/pilot
# --no-index: only the wheels resolved in the build stage, nothing fetched here.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --disable-pip-version-check --no-index --find-links=/wheels \
        /wheels/pilot-*.whl \
 && groupadd --system --gid 1337 pilot \
 && useradd --system --uid 1337 --gid 1337 --home-dir /var/lib/pilot --no-create-home \
        --shell /usr/sbin/nologin pilot \
 && install --directory --owner=1337 --group=1337 --mode=0700 /var/lib/pilot
COPY examples/mesh.yaml /etc/pilot/mesh.yaml
USER 1337:1337
WORKDIR /var/lib/pilot
# 15010 xDS, CA, gRPC health and reflection (plaintext); 15012 the same over TLS;
# 15014 HTTP: /ready, /metrics.
EXPOSE 15010 15012 15014
# Only what the image has: its own Python. An HTTP error (503 before the first full
# state) or a refused connection raises, and the exit status is 1: unhealthy.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:15014/ready', timeout=3)"]
ENTRYPOINT ["pilot", "discovery"]
