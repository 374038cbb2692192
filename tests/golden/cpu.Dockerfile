# Rendered by `builder render` from templates/: do not edit; change matrix.yaml or templates/.
# Target cpu: backend cpu, torch 2.13.0+cpu
#
# Stages, in cache order: common (byte-identical in every target) -> wheel-layer-<layer> (this
# backend's wheels, one stage and layer per group of the layer plan) -> torch (the backend's
# environment, start-up bytecode, torch's facts) -> runtime (the in-image runtime, the layer that
# changes most); beside them tools (the installer, in no layer) and runtime-files (the runtime,
# built while torch installs). Each layer's wheels come from a named build context of their own,
# `wheels-<layer>` (bind-mounted for the RUN that installs them: no network, no server), are
# checked against the hash locks and never stay in a layer; no cache, CA bundle or credential does
# either. Build with `builder build`, or `docker buildx bake` on `builder bake`'s file.

# The shared base, pinned by digest per platform in base.lock.json (not here: a re-pin changes
# that file alone). `builder build` passes the platform's pin as BASE; `builder print` shows it.
ARG BASE
# uv (WHEELS_TOOLS, the installer) in a stage of its own; each installing RUN mounts it. It is in no
# layer of the image. Its wheel is checked against its locked sha256 like every wheel, and its one
# static binary taken out of it: every cold build waits for this stage, and pip took 1.9 s to
# install that one file (its own start-up mostly).
FROM ${BASE} AS tools
ARG WHEELS_TOOLS
RUN --network=none --mount=type=tmpfs,target=/tmp --mount=type=bind,from=wheels-tools,target=/tmp/wheels/tools \
    set -- /tmp/wheels/tools/*.whl \
 && printf '%s  %s\n' "${WHEELS_TOOLS##*--hash=sha256:}" "$1" > /tmp/tools.sha256 \
 && sha256sum --check --strict --quiet /tmp/tools.sha256 \
 && python3 -c "import sys, zipfile; w = zipfile.ZipFile(sys.argv[1]); \
[w.extract(n, '/tmp/uv') for n in w.namelist() if n.endswith('.data/scripts/uv')]" "$1" \
 && install -D -m 0755 /tmp/uv/*.data/scripts/uv /opt/uv/bin/uv

FROM ${BASE} AS common
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# Every RUN ends with fixed times: what it created or changed in the folder it writes in (found by
# ctime, which no tool sets) gets the mtime 1735689600, so a layer's digest depends on its content
# alone, on any machine.
RUN --network=none --mount=type=tmpfs,target=/tmp touch /tmp/.layer \
 && SOURCE_DATE_EPOCH=1735689600 groupadd --gid 1001 app \
 && SOURCE_DATE_EPOCH=1735689600 useradd --uid 1001 --gid 1001 --create-home --shell /bin/bash app \
 && rm -f /etc/.pwd.lock \
 && python3 -m venv --without-pip /opt/venv \
 && install -d -o 1001 -g 1001 /workspace \
 && find / -xdev -cnewer /tmp/.layer -exec touch -h -d @1735689600 {} +
WORKDIR /workspace
# Wheels come as build arguments, one per layer, from the platform's locks (`builder build` passes
# them; `builder print` lists them): WHEELS_<LAYER>="name==version --hash=sha256:<hex> ...", written
# back one per line for --require-hashes, and installed by uv from the tools stage.
ARG WHEELS_COMMON
RUN --network=none --mount=type=tmpfs,target=/tmp --mount=type=bind,from=tools,source=/opt/uv,target=/tmp/uv --mount=type=bind,from=wheels-common,target=/tmp/wheels/common \
    touch /tmp/.layer \
 && printf '%s %s\n' $WHEELS_COMMON > /tmp/common.lock \
 && UV_CACHE_DIR=/opt/venv/.uv-cache /tmp/uv/bin/uv pip install --python /opt/venv/bin/python --link-mode=hardlink --no-index --no-deps --require-hashes \
      --find-links /tmp/wheels/common -r /tmp/common.lock \
 && rm -rf /opt/venv/.lock /opt/venv/.uv-cache && for f in /opt/venv/lib/python3*/site-packages/*.dist-info/uv_cache.json; do [ -e "$f" ] || continue; rm "$f"; sed -i '/[/]uv_cache[.]json,/d' "${f%/uv_cache.json}/RECORD"; done \
 && find /opt/venv -xdev -cnewer /tmp/.layer -exec touch -h -d @1735689600 {} +

# The layer plan (matrix.yaml's layers): one layer per group of the target's locked wheels, by what
# changes together and about 1 GB at most, so a change to one group rebuilds, pushes and pulls that
# layer and those above it, and the engine fetches the layers side by side. Each layer in a stage of
# its own, wheel-layer-<layer>, on the one below: where the image store keeps layers compressed,
# `builder build` exports each stage below the plan's last layer (accelerate: small) beside the build
# as soon as its step runs (a buildx build with nothing stored: BuildKit runs each step once for
# all of them), so each layer is compressed from the moment it is installed, while the layers above
# it install, and the image's export finds them done.
FROM common AS wheel-layer-torch
ARG WHEELS_TORCH
RUN --network=none --mount=type=tmpfs,target=/tmp --mount=type=bind,from=tools,source=/opt/uv,target=/tmp/uv --mount=type=bind,from=wheels-torch,target=/tmp/wheels/torch \
    if [ -n "$WHEELS_TORCH" ]; then touch /tmp/.layer \
 && printf '%s %s\n' $WHEELS_TORCH > /tmp/torch.lock \
 && UV_CACHE_DIR=/opt/venv/.uv-cache /tmp/uv/bin/uv pip install --python /opt/venv/bin/python --link-mode=hardlink --no-index --no-deps --require-hashes \
      --find-links /tmp/wheels/torch -r /tmp/torch.lock \
 && rm -rf /opt/venv/.lock /opt/venv/.uv-cache && for f in /opt/venv/lib/python3*/site-packages/*.dist-info/uv_cache.json; do [ -e "$f" ] || continue; rm "$f"; sed -i '/[/]uv_cache[.]json,/d' "${f%/uv_cache.json}/RECORD"; done \
 && find /opt/venv -xdev -cnewer /tmp/.layer -exec touch -h -d @1735689600 {} +; fi
FROM wheel-layer-torch AS torch
# Bytecode only for what start-up imports (the user cannot write it at run time), in a layer of
# its own above the wheels: fast starts without compiling every module of every package into
# the image; pynvml's too where the image has it (the runtime's check asks NVML at every start,
# and compiling its 8000 lines each time would cost more than the check). The same layer records
# what torch says of its own build (torch-facts.json: version, CUDA or ROCm release, compiled
# distributed backends), which a start reads instead of importing torch; only the runtime's
# facts.py is mounted for it, so a change elsewhere in runtime/ does not rebuild this layer. Both in
# one process, which imports torch once (a second import cost 2 s), and writes no bytecode after
# the start-up imports.
# EMULATED is set when this platform is built under qemu on another architecture: there importing
# torch crashes (its aarch64 oneDNN reads the host's x86 CPU topology from /sys), so those packages
# are compiled whole instead, without importing them (a larger image, the same fast start), and no
# facts are recorded (a start there asks torch). Like pip, that skips the files not meant for this
# Python (torch ships a few for 3.12).
ARG EMULATED
RUN --network=none --mount=type=tmpfs,target=/tmp --mount=type=bind,source=runtime/ml_runtime/devices/facts.py,target=/tmp/facts.py \
    touch /tmp/.layer \
 && if [ -z "$EMULATED" ]; then env -u PYTHONDONTWRITEBYTECODE python -c "import torch; \
import runpy, sys; sys.dont_write_bytecode = True; sys.argv[1:] = ['--record', '/opt/venv/share/ml-runtime/torch-facts.json']; \
runpy.run_path('/tmp/facts.py', run_name='__main__')"; \
    else python -c "import compileall, importlib.util as u, sys; \
[compileall.compile_dir(p, quiet=2, workers=0) for m in sys.argv[1:] \
for p in u.find_spec(m).submodule_search_locations]" torch; fi \
 && python -c "import compileall, importlib.util as u; s = u.find_spec('pynvml'); s and compileall.compile_file(s.origin, quiet=2)" \
 && find /opt/venv -xdev -cnewer /tmp/.layer -exec touch -h -d @1735689600 {} +

# The in-image runtime and the examples, built beside the wheel layers: they need only the common
# stage's Python, pip and pydantic, so a cold build does not wait for pip after torch (1.8 s here).
# pip installs under /layer as if it were / (--root); the runtime stage copies that tree in. Both
# come from the build context as read-only bind mounts, not COPY: no source tree (or its checkout
# times) in a layer, and pip builds a copy of the runtime in /tmp, so the build writes nothing into
# the checkout. The runtime's bytecode is compiled for where it runs (/opt/venv, not /layer), with
# SOURCE_DATE_EPOCH set: hash-checked .pyc files, valid whatever the files' times. The runtime then
# validates its default spec once (a start that uses it unchanged reads the record: no pydantic, no
# YAML); torch's facts were recorded in the torch stage, above.
FROM common AS runtime-files
RUN --network=none --mount=type=tmpfs,target=/tmp --mount=type=bind,source=runtime,target=/tmp/src/runtime --mount=type=bind,source=examples,target=/tmp/examples \
    touch /tmp/.layer \
 && cp -R /tmp/src/runtime /tmp/runtime \
 && pip install --root /layer --no-compile --no-warn-script-location --no-index --no-deps --no-build-isolation /tmp/runtime \
 && cp -R /tmp/examples /layer/opt/examples \
 && SOURCE_DATE_EPOCH=1735689600 python -m compileall -q -s /layer -p / /layer/opt/venv/lib \
 && PYTHONPATH="$(echo /layer/opt/venv/lib/python3*/site-packages)" \
    python -m ml_runtime.contract.record /layer/opt/venv/share/ml-runtime/default-spec.json \
 && find /layer -xdev -cnewer /tmp/.layer -exec touch -h -d @1735689600 {} +

FROM torch AS runtime
COPY --from=runtime-files /layer/ /
# The target's own packages last: targets that differ only in them share every layer below.
ARG WHEELS_PACKAGES
RUN --network=none --mount=type=tmpfs,target=/tmp --mount=type=bind,from=tools,source=/opt/uv,target=/tmp/uv --mount=type=bind,from=wheels-packages,target=/tmp/wheels/packages \
    if [ -n "$WHEELS_PACKAGES" ]; then touch /tmp/.layer \
 && printf '%s %s\n' $WHEELS_PACKAGES > /tmp/packages.lock \
 && UV_CACHE_DIR=/opt/venv/.uv-cache /tmp/uv/bin/uv pip install --python /opt/venv/bin/python --link-mode=hardlink --no-index --no-deps --require-hashes \
      --find-links /tmp/wheels/packages -r /tmp/packages.lock \
 && rm -rf /opt/venv/.lock /opt/venv/.uv-cache && for f in /opt/venv/lib/python3*/site-packages/*.dist-info/uv_cache.json; do [ -e "$f" ] || continue; rm "$f"; sed -i '/[/]uv_cache[.]json,/d' "${f%/uv_cache.json}/RECORD"; done \
 && find /opt/venv -xdev -cnewer /tmp/.layer -exec touch -h -d @1735689600 {} +; fi
LABEL \
      org.opencontainers.image.title="ml-runtime cpu" \
      org.opencontainers.image.version="cpu-torch2.13.0" \
      io.ml-image-builder.target="cpu" \
      io.ml-image-builder.backend="cpu" \
      io.ml-image-builder.vendor="cpu" \
      io.ml-image-builder.accelerator-version="none" \
      io.ml-image-builder.torch="2.13.0+cpu" \
      io.ml-image-builder.distributed="gloo"
USER 1001:1001
# tini is PID 1: it forwards SIGTERM (docker stop, Slurm, Kubernetes) to the command and reaps
# orphans such as DataLoader workers; as a subreaper it also works under `docker run --init`.
# The runtime's vendor_agnostic_wheel check compares torch with what the wheel mapping names.
ENV TINI_SUBREAPER=1 \
    ML_RUNTIME_TORCH="2.13.0+cpu" \
    ML_RUNTIME_FLAVOUR="cpu"
ENTRYPOINT ["/usr/bin/tini", "--", "runtime-check", "exec", "--"]
CMD ["runtime-check", "probe"]
