# The training image: Python 3.11, torch and trainjob (with the examples' packages) at the versions that
# requirements/dev.lock pins, and examples/ in /workspace/examples. A TrainJob's pods run it:
#   buildah bud -f deploy/training.Dockerfile -t <registry>/trainjob-train:0.1.0 .    (or docker build ...)
#   spec.trainer.image: <registry>/trainjob-train:0.1.0
# BASE is any Debian-based image with Python 3.11 and its venv module (python:3.11-slim by default). EXTRAS: the
# optional dependencies of trainjob's pyproject.toml to add, comma-separated (examples,initializers by default, so
# the image also runs python -m trainjob.initializers; add ray for the ray-distributed runtime). torch's CUDA
# libraries come with it from PyPI: the image is several GB, most of it the first layer below.
ARG BASE=python:3.11-slim

# What layer 1 below installs: trainjob's dependencies and EXTRAS' from pyproject.toml, and the build tools that
# install trainjob. Listed in a stage of its own, so that layer 1 is rebuilt when this list or the lock change, and
# not on every edit to pyproject.toml (its tool settings, its version).
FROM ${BASE} AS requirements
ARG EXTRAS=examples,initializers
COPY pyproject.toml /tmp/pyproject.toml
RUN python3 -c 'import os, tomllib; p = tomllib.load(open("/tmp/pyproject.toml", "rb"))["project"]; \
extras = [e for e in os.environ["EXTRAS"].split(",") if e]; \
print("\n".join(p["dependencies"] + [d for e in extras for d in p["optional-dependencies"][e]] + ["setuptools", "wheel"]))' \
      > /requirements.txt

FROM ${BASE}

# Build-time only, never in a layer: a CA bundle for a TLS proxy between the build and PyPI, and a pip cache
# mounted into the build (buildah bud --volume ~/.cache/pip:/pip-cache --build-arg PIP_CACHE_DIR=/pip-cache).
ARG PIP_CERT
ARG PIP_CACHE_DIR

ENV VIRTUAL_ENV=/opt/trainjob \
    PATH=/opt/trainjob/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Layer 1, the large one, rebuilt only when the lock or the list above change: every package trainjob and the
# extras import, at the lock's versions.
COPY requirements/dev.lock /tmp/trainjob-deps/dev.lock
COPY --from=requirements /requirements.txt /tmp/trainjob-deps/requirements.txt
RUN python3 -m venv /opt/trainjob \
 && pip install -q -c /tmp/trainjob-deps/dev.lock -r /tmp/trainjob-deps/requirements.txt \
 && rm -rf /tmp/trainjob-deps /root/.cache/pip

# Layer 2, small: trainjob itself, and the examples. trainjob.pod_site writes trainjob-site.pth, the hook that
# reports a rank's collectives to the operator's stall watch (only in pods whose operator asks for it).
COPY pyproject.toml README.md /tmp/trainjob-src/
COPY src /tmp/trainjob-src/src
RUN pip install -q --no-deps --no-build-isolation /tmp/trainjob-src \
 && python -m compileall -q /opt/trainjob/lib/python3.11/site-packages/trainjob >/dev/null \
 && python -m trainjob.pod_site >/dev/null \
 && rm -rf /tmp/trainjob-src /root/.cache/pip
COPY examples /workspace/examples
WORKDIR /workspace
