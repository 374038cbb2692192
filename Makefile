# ml-image-builder: `make help` lists the targets (built from the ## comments).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
BUILDER := $(VENV)/bin/builder
TARGETS ?=
PLATFORMS ?=
PUSH ?=
SIGN_KEY ?=
REF ?=
KEY ?=
#: The rules `make check` runs from tests/: no grade D, no module over its limit,
#: no Engine method answering in a raw dict, nothing writing the process environment, the print schema current.
RULES := tests/test_complexity.py tests/test_engine_rules.py tests/test_print_schema.py::test_the_committed_schema_is_the_models
TARGET_FLAGS := $(foreach t,$(TARGETS),-t $(t)) $(foreach p,$(PLATFORMS),--platform $(p))

.DEFAULT_GOAL := help
.PHONY: help host install render schema check lint images push verify test test-classic test-heavy test-emulated golden bench gpu-check clean

help: ## Show this help
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml runtime/pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q -e '.[test]' -e ./runtime
	# CPU torch for the runtime's unit tests (pip's configuration here serves torch 2.13.0+cpu).
	$(VENV)/bin/pip install -q 'torch==2.13.0' 'accelerate>=1.0'
	touch $@

install: $(VENV)/.installed ## Create .venv with the builder, the in-image runtime and test tools

host: ## Install the Debian packages builds and tests need (as root) and start dockerd if no engine answers (ENGINE=podman: podman beside it)
	ENGINE=$(or $(ENGINE),docker) scripts/setup-host.sh

render: install ## Render images/<target>/Dockerfile from templates/ and matrix.yaml
	$(BUILDER) render

schema: install ## Write docs/print.schema.json, the JSON Schema of `builder print` (its model: builder/images/printed.py)
	$(BUILDER) print --schema > docs/print.schema.json

check: install ## Check images/ is current, every Dockerfile passes hadolint, the layers hold, no circle of files, mypy is clean, the size rules hold, docs/print.schema.json is current
	$(BUILDER) render --check
	$(BUILDER) lint
	$(VENV)/bin/lint-imports
	$(VENV)/bin/python -m devtools.circles
	$(VENV)/bin/mypy  # pyproject's files: builder, bench, devtools, the runtime, tests
	$(PY) -m pytest -q -p no:cacheprovider $(RULES)

images: install host ## Base + build + smoke-test the default group (TARGETS="cpu nvidia-cu130", PLATFORMS=linux/amd64 for a subset, PUSH=1 to publish, SIGN_KEY=cosign.key to sign and attach SBOM + provenance)
	$(BUILDER) build --keep-going --update-base $(TARGET_FLAGS) $(if $(PUSH),--push) $(if $(SIGN_KEY),--sign-key $(SIGN_KEY))

push: install ## Push built targets to the matrix's registry (TARGETS=... for a subset, SIGN_KEY=cosign.key to sign)
	$(BUILDER) push $(TARGET_FLAGS) $(if $(SIGN_KEY),--sign-key $(SIGN_KEY))

verify: install ## Check a pushed image's signature, SBOM and provenance (REF=localhost:5000/ml-runtime:cpu KEY=cosign.pub)
	$(BUILDER) verify $(REF) $(if $(KEY),--key $(KEY))

test: install host ## The suite on this engine (containerd store; the `podman` tests on podman), then the `classic` tests on a classic-store dockerd; not `heavy` or `emulated` (their own targets)
	-ENGINE=podman scripts/setup-host.sh  # podman beside docker, for the `podman` tests (they say it when it is missing)
	$(PY) -m pytest -q -m 'not emulated and not heavy'
	$(PY) -m devtools.classic -q -m 'classic and not emulated and not heavy'

test-classic: install host ## Only the `classic` tests, on a second dockerd with the classic image store
	$(PY) -m devtools.classic -q -m 'classic and not emulated and not heavy'

test-emulated: install host ## The foreign-platform builds (nvidia-cu130 arm64 under qemu, on Docker and on podman) and their index (marker: emulated)
	-ENGINE=podman scripts/setup-host.sh  # podman beside docker, for the podman one
	$(PY) -m pytest -q -m emulated

test-heavy: install host ## The tests of a system of their own or multi-GB, outside `make test` (marker: heavy): the NVIDIA build, the base on another host, the Slurm cluster, the zstd image on empty engines
	$(PY) -m pytest -q -m 'heavy and not emulated'

golden: install ## Regenerate the golden Dockerfiles in tests/golden/
	UPDATE_GOLDEN=1 $(PY) -m pytest -q tests/test_render.py -k golden

bench: install ## Benchmark builds against the ARG-switch baseline, build avoidance, a fresh node pulling nvidia-cu130 (zstd vs gzip layers), container start
	$(PY) -m bench

clean: ## Remove the venv, caches and dist/ (not the wheelhouse in ~/.cache)
	rm -rf $(VENV) .pytest_cache dist bench/out

gpu-check: ## On a GPU host: the in-image runtime from this checkout with the host's torch, no Docker (GPU_CHECK_OUT=report.json)
	PYTHONPATH=runtime python3 scripts/gpu-check.py --out $(or $(GPU_CHECK_OUT),gpu-check.json)
