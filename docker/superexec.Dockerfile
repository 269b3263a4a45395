# The app image of both SuperExecs (the ServerApp's and each node's ClientApps): Flower's
# official SuperExec image at the pinned Flower version, plus this project's dependencies.
# The app's code itself arrives with each run (the FAB that `flwr run` submits).
#   docker build -f docker/superexec.Dockerfile -t ssfl-superexec .
# TORCH_INDEX_URL: where torch comes from; the default (PyPI) wheels carry CUDA, so a
# client container uses the GPU it is given; https://download.pytorch.org/whl/cpu makes
# a much smaller CPU-only image.
ARG FLWR_VERSION=1.41.0
FROM flwr/superexec:${FLWR_VERSION}

ARG TORCH_INDEX_URL=https://pypi.org/simple
WORKDIR /app
COPY --chown=app:app pyproject.toml README.md ./
COPY --chown=app:app server_app ./server_app
COPY --chown=app:app client_app ./client_app
COPY --chown=app:app strategies ./strategies
COPY --chown=app:app tasks ./tasks
COPY --chown=app:app ssfl ./ssfl
# Keep the image's Flower (no simulation extra, no Ray); install everything else.
RUN sed -i '/"flwr\[simulation\]/d' pyproject.toml \
    && python -m pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" \
       "torch>=2.4" "torchvision>=0.19" \
    && python -m pip install --no-cache-dir .

ENTRYPOINT ["flower-superexec"]
