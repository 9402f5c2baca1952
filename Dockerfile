#
# pilot discovery in a container.
#
#   docker build -t pilot .
#   docker run --rm --network host pilot --config /etc/pilot/mesh.yaml
#
# (With --config streams are trusted by their node metadata, so pilot listens on loopback
# only: with the host's network that is the host's loopback. Publishing ports with -p
# instead needs --insecure-bind-any, and then anyone who reaches them gets any identity's
# certificate.)
#
# Any Docker builder builds it (the legacy one included: no BuildKit-only syntax),
# and it needs no registry beyond its base image and the package index. Layers, from
# the one that changes least:
# - deps: a virtual environment holding exactly requirements/runtime.txt (pinned by
#   `python tools/lock_requirements.py`), so a change in pilot/ downloads nothing;
# - build: pilot's own wheel, built with the pinned backend (requirements/build.txt)
#   without build isolation, installed into /opt/pilot-app; only that directory
#   reaches the image, no compiler, cache or wheel file.
# The image runs as uid 1337 with one writable path, /var/lib/pilot (where a
# self-signed CA root is kept outside Kubernetes); in Kubernetes the root filesystem
# is read-only and an emptyDir is mounted there (deploy/deployment.yaml).

FROM python:3.11-slim AS deps
COPY requirements/build.txt requirements/runtime.txt /tmp/requirements/
RUN python -m venv /opt/pilot \
 && /opt/pilot/bin/pip install --no-cache-dir --disable-pip-version-check \
        --requirement /tmp/requirements/build.txt \
        --requirement /tmp/requirements/runtime.txt

FROM deps AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY pilot ./pilot
RUN /opt/pilot/bin/pip install --no-cache-dir --disable-pip-version-check --no-index \
        --no-deps --no-build-isolation --target /opt/pilot-app .

FROM python:3.11-slim
LABEL org.opencontainers.image.title="pilot" \
      org.opencontainers.image.description="An asyncio xDS/SDS control plane for Envoy, with Istio's conventions" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/opt/pilot-app \
    PATH=/opt/pilot-app/bin:/opt/pilot/bin:$PATH \
    XDG_STATE_HOME=/var/lib/pilot
# 1337 is Istio's proxy uid; a regular (not --system) account, as it is above the
# system range.
RUN groupadd --gid 1337 pilot \
 && useradd --uid 1337 --gid 1337 --home-dir /var/lib/pilot --no-create-home \
        --shell /usr/sbin/nologin pilot \
 && install --directory --owner=1337 --group=1337 --mode=0700 /var/lib/pilot
COPY --from=deps /opt/pilot /opt/pilot
COPY --from=build /opt/pilot-app /opt/pilot-app
COPY examples/mesh.yaml /etc/pilot/mesh.yaml
USER 1337:1337
WORKDIR /var/lib/pilot
# 15010 xDS, CA, gRPC health and reflection (plaintext); 15012 the same over TLS;
# 15014 HTTP: /ready, /metrics; 15017 the sidecar-injection webhook (HTTPS).
EXPOSE 15010 15012 15014 15017
# /ready on the address pilot's own --http-addr names (read from its command line):
# 503 before the first full state, or a refused connection, is unhealthy.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-m", "pilot.healthcheck"]
ENTRYPOINT ["pilot", "discovery"]
