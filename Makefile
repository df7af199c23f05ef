# EdgeFold. `make edge MODEL=resnet50` runs the pipeline; `make test` runs the tests.
# Every variable can be set on the command line: make edge MODEL=tiny DATA=digits
PYTHON   ?= python3
VENV     ?= .venv
MODEL    ?= resnet50
DATA     ?=
WEIGHTS  ?=
RUN      ?=
UNTIL    ?=
FORCE    ?=
SET      ?=
QUANTIZER ?=
EDGE     ?=
DC       ?=
DEVICES  ?=
TOKEN_FILE ?=
RUNG     ?= best
DEVICE   ?=
TO       ?=
MAX_DROP ?=
# make ship's check of the folder it wrote: auto (where it takes under a minute), full, or off.
CHECK    ?= auto
HOST     ?= 127.0.0.1
PORT     ?= 8765
AGENT_DATA ?= $(HOME)/.local/share/edgefold-agent
L4T      ?=
# The host jtop service's jetson-stats version for the Jetson image's client (jtop refuses another major.minor).
JETSON_STATS ?=
NPROC    ?= 1
DOCKER   ?= docker
BUNDLE_DIR ?= dist
RUNS     ?= runs
EXTRAS   ?= build,device,modelopt,nvml,dev
# The exact versions the tests and benchmarks ran with, for x86_64 and aarch64 (make lock refreshes it); setup.cfg
# keeps ranges for people who install EdgeFold into an environment of their own. LOCK= (empty) installs without it.
LOCK     ?= constraints.txt
# The agent's own lock (make agent-lock): the device, nvml and jetson extras resolved for aarch64 and Python 3.10
# with numpy<2 (JetPack 6's Torch-TensorRT wheel), which the Jetson image, the bundle and make agent on a Jetson
# install.
AGENT_LOCK ?= docker/agent-constraints.txt
PYTEST_ARGS ?=
# Test workers (pytest-xdist, the dev extra); each test file runs whole on one worker, the longest files first
# (tests/conftest.py). 1: no xdist. One more than the cores (at most 8): two workers left about a fifth of two cores
# idle, waiting on agents, the jtop service and child processes, which a third worker fills (median of three clean
# runs 10.8 → 9.3 min here, bench/results/suite-time-test-20261205-*); more than 8 mostly adds memory.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n + 1 < 8 ? n + 1 : 8 )))
BENCH_MODEL ?= resnet50

# On a Jetson, JetPack installs TensorRT's Python bindings into the system Python's dist-packages: the
# virtualenv must see the system's packages, or the agent cannot import TensorRT and times ONNX Runtime.
JETSON_RELEASE ?= /etc/nv_tegra_release
SYSTEM_SITE_PACKAGES ?= $(if $(wildcard $(JETSON_RELEASE)),1,)
# The agent's own packages (no torch): NVML off a Jetson. On a Jetson the venv sees the system's jtop client, which
# matches the system's jtop service; jetson-stats is installed into the venv only where no jtop is importable (a
# client of another major.minor than the service is refused by it).
AGENT_EXTRAS ?= $(if $(SYSTEM_SITE_PACKAGES),device,device$(COMMA)nvml)
COMMA    := ,

BIN      := $(VENV)/bin
# The run folder's name: a recipe's, or an ONNX start's file name (an Ultralytics .pt: the .onnx exported beside it).
RUN_NAME = $(if $(filter %.onnx,$(MODEL)),$(notdir $(MODEL)),$(if $(filter %.pt,$(MODEL)),$(notdir $(MODEL:.pt=.onnx)),$(MODEL)))
EDGEFOLD := $(BIN)/edgefold
STAMP    := $(VENV)/.edgefold-installed
AGENT_STAMP := $(VENV)/.edgefold-agent-installed
FASHION_MNIST_DIR ?= /usr/share/datasets/fashion-mnist

EDGE_ARGS := $(strip $(if $(DATA),--data '$(DATA)') $(if $(WEIGHTS),--weights '$(WEIGHTS)') \
             $(if $(RUN),--run-id '$(RUN)') $(if $(UNTIL),--until $(UNTIL)) \
             $(foreach s,$(FORCE),--force $(s)) $(foreach s,$(SET),--set '$(s)') \
             $(if $(QUANTIZER),--set quantize.quantizer=$(QUANTIZER)) --runs-dir '$(RUNS)' \
             $(if $(EDGE),--edge '$(EDGE)') $(if $(DC),--dc '$(DC)') $(if $(DEVICES),--devices '$(DEVICES)') \
             $(if $(TOKEN_FILE),--token-file '$(TOKEN_FILE)'))

# NPROC>1: the training stages run as one DDP job under torchrun (NCCL on GPUs, gloo on CPU).
RUN_CMD := $(if $(filter-out 1,$(NPROC)),$(BIN)/torchrun --standalone --nproc_per_node=$(NPROC) -m pipeline,$(EDGEFOLD))

# OpenMP's wait: its default short spin for runs (PASSIVE, threads asleep at every wait, trained ResNet-50 about
# 27% slower on two cores: bench/results/train-speed-*); the tests set PASSIVE themselves (tests/conftest.py), since
# many processes share the cores there and a spinning wait steals another's time.

.PHONY: help venv agent-venv lock agent-lock edge test test-fast ship bench bench-seeds readme-figures data agent report docker-jetson docker-dc docker-pipeline bundle clean distclean

help:
	@echo "make edge MODEL=resnet50   run the pipeline (data → teacher → prune → distill → export → quantize → evaluate → deploy → report)"
	@echo "make edge MODEL=model.onnx DATA=imagefolder:/path   start from a trained classifier's ONNX file (FP32 → FP16 → INT8, measured)"
	@echo "     variables: DATA=fashion-mnist|digits|imagefolder:/path (detection: fmnist-det|digits-det|coco:/path.json) WEIGHTS=path|imagenet RUN=id UNTIL=stage FORCE='stage …' SET='key=value …'"
	@echo "     NPROC=8: teacher and distill as one DDP job over 8 processes (torchrun)"
	@echo "     devices:   EDGE=http://jetson:8765[,…] DC=http://gpu:8765 DEVICES=devices.yaml TOKEN_FILE=path (none: a loopback agent)"
	@echo "make report MODEL= RUN=id      rebuild a run's report (default: the model's latest run)"
	@echo "make ship MODEL= [RUN= RUNG=best DEVICE= TO= MAX_DROP=1 CHECK=auto]  the folder an application runs a rung from, checked"
	@echo "make agent [HOST= PORT= AGENT_DATA= TOKEN_FILE=]  run the device agent here (on a Jetson its venv sees JetPack's TensorRT)"
	@echo "make docker-jetson L4T=36.4.3 | docker-dc | docker-pipeline   build (and smoke-test) the images"
	@echo "make bundle L4T=36.4.3     offline agent bundle for an air-gapped Jetson (dist/)"
	@echo "   TORCH_TENSORRT=1          with docker-jetson, docker-dc and bundle: + Torch-TensorRT and ModelOpt"
	@echo "make test                  run the tests (TEST_WORKERS=$(TEST_WORKERS) pytest-xdist workers; PYTEST_ARGS=...)"
	@echo "make test-fast             the inner loop: the tests not marked slow (no pipeline runs or agents)"
	@echo "make bench                 time the default run (first and cached) into bench/results/"
	@echo "make bench-seeds MODEL=tiny SEEDS=5   a recipe's gates and figures over seeds into bench/results/"
	@echo "make readme-figures        the README's generated parts again: console examples, the report's picture, figures"
	@echo "make data                  install Fashion-MNIST (Debian's dataset-fashion-mnist)"
	@echo "make lock                  re-resolve constraints.txt, the exact versions make installs (x86_64 and aarch64)"
	@echo "make agent-lock            re-resolve docker/agent-constraints.txt, the agent's (images, bundle, a Jetson)"
	@echo "make clean | distclean     remove runs/ | also the virtual environment"

venv: $(STAMP)

# The virtualenv itself. With SYSTEM_SITE_PACKAGES (a Jetson), one made earlier without the system's
# packages is switched over: `venv --upgrade` rewrites its pyvenv.cfg and keeps what is installed.
$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 10))' || \
	  { echo "error: EdgeFold needs Python ≥ 3.10; pass PYTHON=python3.11"; exit 2; }
	$(PYTHON) -m venv $(if $(SYSTEM_SITE_PACKAGES),--system-site-packages) $(VENV)

.PHONY: venv-system-site
venv-system-site: $(BIN)/python
	$(if $(SYSTEM_SITE_PACKAGES),@grep -qx 'include-system-site-packages = true' $(VENV)/pyvenv.cfg || \
	  { echo "$(VENV) was made without the system's packages (JetPack's TensorRT lives there): switching it over"; \
	    $(PYTHON) -m venv --system-site-packages --upgrade --without-pip $(VENV); },@true)

LOCK_ARGS := $(if $(LOCK),-c '$(LOCK)')

$(STAMP): setup.cfg pyproject.toml $(LOCK) | venv-system-site
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]' $(LOCK_ARGS)
	touch $@

# Fashion-MNIST is only needed when the recipe (or DATA=) asks for it.
data: $(STAMP)
	@src="$(DATA)"; [ -n "$$src" ] || src=$$($(EDGEFOLD) recipe $(MODEL) --get data.source) || exit 2; \
	case "$$src" in fashion-mnist|fmnist-det) ;; *) exit 0 ;; esac; \
	[ -n "$$EDGEFOLD_FASHION_MNIST_DIR" ] && exit 0; \
	[ -f $(FASHION_MNIST_DIR)/t10k-labels-idx1-ubyte.gz ] && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Fashion-MNIST (apt-get install dataset-fashion-mnist)"; \
	  apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || \
	  { apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist; }; \
	else \
	  echo "error: Fashion-MNIST is not installed at $(FASHION_MNIST_DIR)"; \
	  echo "  fix: sudo apt-get install dataset-fashion-mnist, or pass DATA=digits or DATA=imagefolder:/path"; \
	  exit 2; \
	fi

edge: $(STAMP) data
	$(RUN_CMD) run $(MODEL) $(EDGE_ARGS)

XDIST = $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: $(STAMP)
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

# The inner loop: every test but those that run whole pipelines, agents or sustained jobs (marked slow).
test-fast: $(STAMP)
	$(BIN)/python -m pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

bench: $(STAMP) data
	$(BIN)/python bench/edge_bench.py --model $(BENCH_MODEL) --runs-dir '$(RUNS)'

# A recipe's gates over seeds (SEEDS runs, resumable), then the README's figures from the result files.
SEEDS ?= 5
bench-seeds: $(STAMP) data
	$(BIN)/python bench/recipe_seeds.py --recipe $(MODEL) --seeds $(SEEDS)

# The README's generated parts: the console examples run again (minutes), the report's picture, the install time, the
# figures from bench/results; `make test` fails when the README is not what these files say.
readme-figures: $(STAMP)
	$(BIN)/python bench/readme_figures.py --examples --screenshot --install-time

agent-venv: $(AGENT_STAMP)

# On a Jetson the venv is the agent's alone: it installs with the agent's lock (numpy<2, JetPack's wheels).
AGENT_LOCK_ARGS := $(if $(SYSTEM_SITE_PACKAGES),$(if $(AGENT_LOCK),-c $(AGENT_LOCK)),$(LOCK_ARGS))
$(AGENT_STAMP): setup.cfg pyproject.toml $(LOCK) $(AGENT_LOCK) | venv-system-site
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(AGENT_EXTRAS)]' $(AGENT_LOCK_ARGS)
	$(if $(SYSTEM_SITE_PACKAGES),$(BIN)/python -c 'import jtop' 2>/dev/null || \
	  $(BIN)/python -m pip install --quiet 'jetson-stats' $(AGENT_LOCK_ARGS))
	touch $@

# One universal resolve (uv) of every extra make installs, for Python 3.10+ on x86_64 and aarch64 (markers say
# which line is whose). Re-run after changing setup.cfg, then make test.
LOCK_EXTRAS := build device modelopt nvml dev jetson
lock: | venv-system-site
	$(BIN)/python -m pip install --quiet 'uv>=0.9'
	@{ echo "# EdgeFold's lock: generated $$(date -u +%Y-%m-%d) by 'make lock', which runs:"; \
	   echo "#   uv pip compile setup.cfg $(foreach e,$(LOCK_EXTRAS),--extra $(e)) --universal --python-version 3.10"; \
	   echo "# make installs with it as pip constraints (-c); setup.cfg keeps the ranges."; \
	   $(BIN)/uv pip compile setup.cfg $(foreach e,$(LOCK_EXTRAS),--extra $(e)) --universal --python-version 3.10 \
	     --no-header --quiet; } > $(LOCK).new && mv $(LOCK).new $(LOCK)
	@echo "wrote $(LOCK): $$(grep -c '==' $(LOCK)) pins"

# The agent's lock: resolved for the Jetson (aarch64, JetPack 6's Python 3.10) without markers, so that pip download
# --platform for another target reads the same pins; make test's bundle tests resolve it for L4T 36 and 38.
agent-lock: | venv-system-site
	$(BIN)/python -m pip install --quiet 'uv>=0.9'
	@{ echo "# EdgeFold agent's lock: generated $$(date -u +%Y-%m-%d) by 'make agent-lock', which runs:"; \
	   echo "#   uv pip compile setup.cfg docker/agent-lock.in --extra device --extra nvml --extra jetson --python-version 3.10 --python-platform aarch64-unknown-linux-gnu"; \
	   echo "# The Jetson image, the offline bundle and make agent on a Jetson install with it (-c)."; \
	   $(BIN)/uv pip compile setup.cfg docker/agent-lock.in --extra device --extra nvml --extra jetson \
	     --python-version 3.10 --python-platform aarch64-unknown-linux-gnu --no-header --no-annotate --quiet; \
	 } > $(AGENT_LOCK).new && mv $(AGENT_LOCK).new $(AGENT_LOCK)
	@echo "wrote $(AGENT_LOCK): $$(grep -c '==' $(AGENT_LOCK)) pins"

# Its first line says which TensorRT it found (or why none) and what runtime `auto` will measure with.
agent: $(AGENT_STAMP)
	$(BIN)/edgefold-agent serve --host $(HOST) --port $(PORT) --data-dir '$(AGENT_DATA)' \
	    $(if $(TOKEN_FILE),--token-file '$(TOKEN_FILE)')

# The folder an application runs one rung from (edgefold ship): RUNG=best is the fastest within MAX_DROP points.
ship: $(STAMP)
	$(EDGEFOLD) ship '$(RUNS)/$(RUN_NAME)/$(if $(RUN),$(RUN),latest)' \
	    --rung '$(RUNG)' $(if $(DEVICE),--device '$(DEVICE)') $(if $(TO),--to '$(TO)') \
	    $(if $(MAX_DROP),--max-drop $(MAX_DROP)) $(if $(TOKEN_FILE),--token-file '$(TOKEN_FILE)') \
	    $(if $(CHECK),--check $(CHECK))

report: $(STAMP)
	$(EDGEFOLD) report '$(RUNS)/$(RUN_NAME)/$(if $(RUN),$(RUN),latest)'

# Image builds need Docker with buildx (and QEMU binfmt for arm64): see docker/README.md.
PLATFORMS := $(PYTHON) docker/platforms.py

docker-jetson:
	@test -n "$(L4T)" || { echo "error: L4T is required, e.g. make docker-jetson L4T=36.4.3 (cat /etc/nv_tegra_release on the Jetson)" >&2; exit 2; }
	@args=$$($(PLATFORMS) build-args '$(L4T)' $(if $(filter 1,$(TORCH_TENSORRT)),--torch-tensorrt)) && \
	  tag=$$($(PLATFORMS) tag jetson '$(L4T)' $(if $(filter 1,$(TORCH_TENSORRT)),--torch-tensorrt)) && \
	  set -x && $(DOCKER) buildx build --platform linux/arm64 $$args $(if $(JETSON_STATS),--build-arg JETSON_STATS='$(JETSON_STATS)') \
	    -t "$$tag" -f docker/jetson.Dockerfile --load . && \
	  docker/smoke.sh "$$tag" aarch64

docker-dc:
	@tag=$$($(PLATFORMS) tag dc $(if $(filter 1,$(TORCH_TENSORRT)),--torch-tensorrt)) && set -x && \
	  $(DOCKER) buildx build --platform linux/amd64 $(if $(filter 1,$(TORCH_TENSORRT)),--build-arg=WITH_TORCH_TENSORRT=1) \
	    -t "$$tag" -f docker/dc.Dockerfile --load . && \
	  docker/smoke.sh "$$tag" x86_64

docker-pipeline:
	@tag=$$($(PLATFORMS) tag pipeline) && set -x && \
	  $(DOCKER) buildx build --platform linux/amd64 -t "$$tag" -f docker/pipeline.Dockerfile --load . && \
	  $(DOCKER) run --rm "$$tag" recipes --check

bundle: $(STAMP)
	@test -n "$(L4T)" || { echo "error: L4T is required, e.g. make bundle L4T=36.4.3" >&2; exit 2; }
	$(BIN)/python docker/bundle.py --l4t '$(L4T)' --out '$(BUNDLE_DIR)' $(if $(filter 1,$(TORCH_TENSORRT)),--torch-tensorrt)

clean:
	rm -rf $(RUNS) .pytest_cache

distclean: clean
	rm -rf $(VENV) *.egg-info
