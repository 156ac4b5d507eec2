# Every target sets itself up: `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WORKDIR ?= runs/default

.PHONY: install install-test demo test test-fast bench bench-data lint lock clean tatoeba-data

install: $(VENV)/.installed

# Every install takes the versions the suite last passed with (constraints.txt, written by
# `make lock`): a clone next year installs what was tested. To move to newer releases:
# `make clean && make test CONSTRAINTS= && make lock`, then commit constraints.txt.
CONSTRAINTS ?= constraints.txt
PIN = $(if $(CONSTRAINTS),-c $(CONSTRAINTS))

# pip's own output (the index's and the build backend's lines) goes to $(PIP_LOG), shown when a
# step fails; the targets print one line per step.
PIP_LOG = $(VENV)/install.log
define pip_install
	@echo "transformer_jax: $(1)"
	@$(PY) -m pip install $(2) >>$(PIP_LOG) 2>&1 || { tail -n 40 $(PIP_LOG); \
	    echo "transformer_jax: pip failed (the whole log: $(PIP_LOG))"; exit 1; }
endef

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	@echo "transformer_jax: creating $(VENV) ($(PYTHON) -m venv; pip's log: $(PIP_LOG))"
	@$(PYTHON) -m venv $(VENV)
	$(call pip_install,upgrading pip,--upgrade pip)
	$(call pip_install,installing transformer_jax and its dependencies (pip install -e '.[test]' $(PIN)),-e '.[test]' $(PIN))
	@touch $@

# The tests also need the optional extras `wmt` (tensorflow-cpu: TFDS's WMT builders, mocked),
# `postgres` (psycopg2-binary: sweep storage on a PostgreSQL server), `beam` (apache-beam:
# corpus preparation as a pipeline, run on the DirectRunner), `ctranslate2` (the export's
# runtime), `hf` (torch + transformers: the Marian import's reference implementation) and `tpu`
# (libtpu: the TPU compiler, for the compile tool's tests).
TEST_EXTRAS = test,wmt,postgres,beam,ctranslate2,hf,tpu
install-test: $(VENV)/.installed-test

# The CUDA plugin (the `gpu-compile` extra: XLA's GPU compiler, for the compile tool's GPU
# targets) goes into a folder of its own that only the tests compiling for GPUs put on their
# PYTHONPATH: beside the packages, every test process that starts JAX would load its 460 MB.
GPU_COMPILE_DIR = $(VENV)/gpu-compile
$(VENV)/.installed-test: $(VENV)/.installed
	$(call pip_install,installing the test extras (pip install -e '.[$(TEST_EXTRAS)]' $(PIN)),-e '.[$(TEST_EXTRAS)]' $(PIN))
	@rm -rf $(GPU_COMPILE_DIR)  # (pip --target keeps what is there: a plugin of another jaxlib)
	$(call pip_install,installing the CUDA plugin into $(GPU_COMPILE_DIR),--no-deps --target $(GPU_COMPILE_DIR) $(PIN) jax-cuda12-plugin==$$($(PY) -c 'import jaxlib; print(jaxlib.__version__)') jax-cuda12-pjrt==$$($(PY) -c 'import jaxlib; print(jaxlib.__version__)'))
	@touch $@

# Train the default config (Multi30k de->en, embedded) and print test2016 BLEU + translations.
demo: install
	$(PY) train.py --config=configs/default.py --workdir=$(WORKDIR)

# Lint, then both test tiers in parallel over the machine's cores (pytest-xdist, work stealing):
# tests/unit (in-process) and tests/integration (processes: the CLIs as installed, reliability,
# multi-host, 8 devices, sweeps; compile-heavy step variants, the WMT mock).
test: install-test lint
	$(PY) -m pytest -q -n auto --dist worksteal tests

# The unit tier alone: the edit-test loop.
test-fast: install-test
	$(PY) -m pytest -q -n auto --dist worksteal tests/unit

# TORCH_PYTHON=/path/to/venv/bin/python (torch==2.13.0, transformers==5.23.0) adds the
# PyTorch peer's figures, measured between ours.
PEER = $(if $(TORCH_PYTHON),--torch_python=$(TORCH_PYTHON) --rounds=2)
bench: install
	$(PY) benchmarks/train_speed.py --config=configs/tiny.py
	$(PY) benchmarks/train_speed.py --config=configs/default.py --dtypes=float32,bfloat16
	$(PY) benchmarks/train_speed.py --config=configs/wmt_base.py --config.data.batch_size=8 \
	    --steps=3 --dtypes=float32,bfloat16
	$(PY) benchmarks/train_speed.py --shape=small --dtypes=float32,bfloat16 $(PEER)
	$(PY) benchmarks/train_speed.py --shape=base --dtypes=float32,bfloat16 $(PEER)
	$(PY) benchmarks/decode_speed.py --shape=small $(if $(TORCH_PYTHON),--torch_python=$(TORCH_PYTHON))

# The data path on Tatoeba de-en and 10 copies of it: time and peak memory per stage.
bench-data: install
	$(PY) benchmarks/data_pipeline.py --replicas=1,10 --train_steps_per_sec=1.0

# ruff: pyflakes, pycodestyle errors and warnings, import order (pyproject.toml).
lint: install
	$(VENV)/bin/ruff check --quiet .

# constraints.txt: every package of the test environment at the version installed, local
# build labels dropped (torch's +cpu: `==2.13.0` admits it, and other machines' indexes name
# it without one).
lock: install-test
	@{ echo "# The versions \`make test\` passed with (make lock; Makefile: how to refresh)."; \
	  $(PY) -m pip freeze --exclude-editable | sed -E 's/\+[A-Za-z0-9.]+$$//'; } > constraints.txt
	@touch $(VENV)/.installed $(VENV)/.installed-test  # (installed with these: no reinstall)
	@echo "transformer_jax: wrote constraints.txt ($$(grep -c '==' constraints.txt) pins)"

clean:
	rm -rf $(VENV) runs .pytest_cache .test-cache

# Tatoeba de-en: the leak-free split of ../shared/data (see configs/tatoeba_deen.py).
SHARED ?= ../shared/data
TATOEBA_TEST = $(SHARED)/tatoeba-test/deu-eng/tatoeba-test
tatoeba-data: install
	$(PY) -m transformer_jax.cli.split_corpus --pairs=$(SHARED)/tatoeba-anki/deu-eng/deu.txt.gz \
	    --columns=en,de --group_by=en --dedup_test_by=de --out=data/tatoeba-deen \
	    --test=de=$(TATOEBA_TEST)-v2021-08-07.deu.gz,en=$(TATOEBA_TEST)-v2021-08-07.eng.gz \
	    --exclude=$(TATOEBA_TEST)-v2020-07-28.deu.gz,$(TATOEBA_TEST)-v2020-07-28.eng.gz,$(TATOEBA_TEST)-v2021-03-30.deu.gz,$(TATOEBA_TEST)-v2021-03-30.eng.gz
