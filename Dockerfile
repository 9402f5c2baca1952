# pilot discovery in a container: a wheel built in one stage, installed in a slim one.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY pilot ./pilot
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --uid 1337 --no-create-home --shell /usr/sbin/nologin pilot
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
COPY examples/mesh.yaml /etc/pilot/mesh.yaml
USER 1337
# xDS (gRPC: ADS, CDS, EDS, health, reflection) and HTTP (/ready)
EXPOSE 15010 15014
ENTRYPOINT ["pilot", "discovery"]
