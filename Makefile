# gradfidelity: two entry points for a fresh machine.
#   make reproduce   install everything, run the smoke DAG, print where the outputs are
#   make test        install everything, run the test suite
# Everything (venv, DeepSpeed 0.18.9 overlay, caches) lives inside this checkout.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The buggy DeepSpeed environment: the main stack with only deepspeed==0.18.9 swapped in
# (an overlay put first on PYTHONPATH; see envs/README.md).
DS_BUGGY := .venv-ds0189
SCALE ?= smoke
CORES ?= 2
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.cache/torch_extensions
export MPLCONFIGDIR := $(CURDIR)/.cache/matplotlib
export HF_HOME := $(CURDIR)/.cache/huggingface
export HF_HUB_OFFLINE := 1
export XDG_CACHE_HOME := $(CURDIR)/.cache/xdg
export PIP_DISABLE_PIP_VERSION_CHECK := 1
export DS_ACCELERATOR := cpu

.PHONY: setup reproduce run test test-fast test-slurm lint-only check-reference check-rebuild cpu-part cpu-aggregate cpu-data docs lint dryrun report clean-results
setup: $(VENV)/.stamp $(DS_BUGGY)/.stamp $(VENV)/.checkout-env $(VENV)/.ds-ops

# DeepSpeed's CPU ops (the shared-memory comm op, cpu_adam) JIT-built once per pinned version into the checkout's
# cache (0.18.9 in its own subfolder: src/gradfidelity/harness/extensions.py), so the first audit, the guard and the
# first training job do not each pay minutes of compilation.
$(VENV)/.ds-ops: $(VENV)/.stamp $(DS_BUGGY)/.stamp
	$(PY) -m gradfidelity.studies.ds_audit.worker --prebuild
	PYTHONPATH=$(DS_BUGGY) $(PY) -m gradfidelity.studies.ds_audit.worker --prebuild
	touch $@

# A .pth line that keeps every cache of this venv's programs in .cache/ (src/gradfidelity/checkout_env.py): a
# direct `.venv/bin/snakemake ...` writes nothing to the home directory either.
$(VENV)/.checkout-env: $(VENV)/.stamp src/gradfidelity/checkout_env.py
	$(PY) -c "import site, pathlib, gradfidelity.checkout_env as e; pathlib.Path(site.getsitepackages()[0], e.PTH_NAME).write_text(e.PTH_LINE)"
	touch $@

$(VENV)/.stamp: envs/requirements.txt envs/dev.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first and pinned: pip takes the local CPU wheel instead of a multi-GB CUDA build
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -r envs/requirements.txt -r envs/dev.txt
	$(PIP) install -q --no-deps -e .
	$(PIP) check
	touch $@

$(DS_BUGGY)/.stamp: envs/requirements-ds0189.txt $(VENV)/.stamp
	rm -rf $(DS_BUGGY)
	$(PIP) install -q --no-deps --target $(DS_BUGGY) -r envs/requirements-ds0189.txt
	PYTHONPATH=$(DS_BUGGY) $(PY) -c "import deepspeed; assert deepspeed.__version__ == '0.18.9', deepspeed.__version__"
	touch $@

reproduce: setup
	$(MAKE) --no-print-directory run
	$(VENV)/bin/snakemake -c$(CORES) --config scale=$(SCALE) --report results/$(SCALE)/report.html
	@echo
	@echo "Done (scale=$(SCALE)). Outputs:"
	@echo "  tables:         paper_tables/$(SCALE)/"
	@echo "  figures:        figures/$(SCALE)/"
	@echo "  claims report:  paper_tables/$(SCALE)/claims.md   (one claim: .venv/bin/gradfidelity claim C4 --scale $(SCALE))"
	@echo "  runs tables:    results/$(SCALE)/runs/<study>.csv"
	@echo "  HTML report:    results/$(SCALE)/report.html"

# The DAG (or TARGETS) without the install step. After a kill -9 of snakemake its lock stays behind: it is removed
# only when no snakemake runs in this directory; incomplete jobs rerun (the default profile's rerun-incomplete) and
# training runs resume from their checkpoints.
run:
	$(PY) -m gradfidelity unlock-stale --snakemake $(VENV)/bin/snakemake
	$(VENV)/bin/snakemake $(TARGETS) -c$(CORES) --config scale=$(SCALE) $(CONFIG)

# The test tiers. FAST: unit tests, no end-to-end DAG, no DeepSpeed launch, nothing slow (at most 3 minutes on 2
# cores). REST: everything else but SLURM. `make test` is the whole suite: lint, FAST, REST, then the SLURM slice,
# each tier's time printed (.ci/run calls it). CONTRIBUTING.md says which to run when.
# SLURM: a one-node cluster started and stopped by the test itself (root, or slurm-wlm installed; skipped with the
# reason elsewhere).
FAST := not slow and not e2e and not deepspeed and not slurm
PYTEST := $(VENV)/bin/python -m pytest -q -p no:cacheprovider
tier = t0=$$(date +%s); $(2); rc=$$?; echo "== tier $(1): $$(( $$(date +%s) - t0 )) s (exit $$rc)"; exit $$rc

test: setup
	@$(call tier,lint,$(MAKE) --no-print-directory lint-only)
	@$(call tier,fast,$(PYTEST) -m "$(FAST)" tests)
	@$(call tier,rest,$(PYTEST) --durations=15 -m "not ($(FAST)) and not slurm" tests)
	@$(call tier,slurm,$(PYTEST) -rs -m slurm tests)

test-slurm: setup
	@$(call tier,slurm,$(PYTEST) -rs -m slurm tests)

test-fast: setup
	@$(call tier,fast,$(PYTEST) --durations=10 -m "$(FAST)" tests)

lint-only:
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/snakemake --lint

# The reviewer's check of the committed cpu results: a fixed stratified sample of runs (every study) rerun in a
# scratch copy, one Snakemake call per study (drift-only studies first, study A last); every training metric compared
# with results/cpu/runs/*.csv (bit for bit on the same host type, else within the measured cross-host drift; study A's
# claim metrics as one more seed of their arm). One short run per study measures this host's speed first and the
# expected time is printed. BUDGET=SECONDS sizes the sample to that wall time and stops there (default: the fixed
# sample, run to its end). Exit 0: all within their rules, no verdict flipped; 1: a metric outside its rule;
# 3: only verdicts flipped; 4: incomplete (a rerun job failed, the budget ran out, Ctrl-C): the runs that finished
# are compared, none outside its rule. One summary line last; the compared runs' table in .cache/check-reference.csv.
check-reference: setup cpu-data
	$(PY) -m gradfidelity check-reference --cores $(CORES) --out .cache/check-reference.csv $(if $(BUDGET),--budget $(BUDGET))

# Every committed table, figure, claim and runs table rebuilt from the committed run records (no training job) and
# compared with the committed files: exit 1 naming each file that differs (CONTRIBUTING.md, committing cpu results).
check-rebuild: setup
	$(PY) -m gradfidelity check-rebuild --cores $(CORES)

# A study's cpu run in parts (CONTRIBUTING.md): `make cpu-part STUDY=local PART=1/3` trains the first third (by whole
# seeds) of the runs that have no committed record; `make cpu-aggregate STUDY=local` lists what is still missing and
# stops, or builds the study's tables and claims once every part is there. CONFIG: extra KEY=VALUE for --config.
cpu-part: setup cpu-data
	$(PY) -m gradfidelity cpu-part --study $(STUDY) --part $(PART) --cores $(CORES) --config $(CONFIG)

cpu-aggregate: setup
	$(PY) -m gradfidelity cpu-part --study $(STUDY) --status --config $(CONFIG)
	$(VENV)/bin/snakemake -c$(CORES) $(STUDY) results/cpu/runs/$(STUDY).csv --config scale=cpu $(CONFIG)

# The cpu scale's real-text corpus for study C: the reStructuredText sources in Debian's python3.11-doc (PSF licence;
# docs/sources.md, Study C), taken from the pinned .deb and unpacked into the checkout's cache by any user. Nothing is
# installed, upgraded or written outside the checkout: no apt, no root (tests/test_setup_nonroot.py runs it as nobody).
# Pinned: the corpus's MD5 (LOCAL_PYDOCS_MD5 in workflow/rules/local.smk) is that release's; Debian's older point
# release (deb12u8) gives another text, and the committed cpu runs of study C were made on deb12u9. The .deb comes from
# the first of PYDOCS_URLS that gives PYDOCS_SHA256 (the SHA-256 that bookworm-security's signed Packages index lists):
# the security archive's pool, the main pool (where a point release moves it), snapshot.debian.org (by its SHA-1).
# Offline: put the .deb into .cache/python3.11-doc/ yourself (`apt-get download python3.11-doc=<version>` there).
# The corpus root that rule local_corpus_pydocs reads: $(PYDOCS_TREE)/usr/share/doc/python3.11/html/_sources.
PYDOCS_VERSION := 3.11.2-6+deb12u9
PYDOCS_DEB := python3.11-doc_$(PYDOCS_VERSION)_all.deb
PYDOCS_SHA256 := 5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be
PYDOCS_URLS ?= https://security.debian.org/debian-security/pool/updates/main/p/python3.11/$(PYDOCS_DEB) \
  https://deb.debian.org/debian/pool/main/p/python3.11/$(PYDOCS_DEB) \
  https://snapshot.debian.org/file/924896f88455aa449baeae5c3268c4672b95c9b8
PYDOCS_DIR := .cache/python3.11-doc
PYDOCS_TREE := $(PYDOCS_DIR)/$(PYDOCS_VERSION)
cpu-data: $(PYDOCS_TREE)/.complete

# The .deb is kept (a second checkout or the test copies it) and used only when its SHA-256 is the pin; the tree is
# unpacked into a temporary folder and renamed into place, so an interrupted run leaves no half tree behind a stamp.
$(PYDOCS_TREE)/.complete:
	@set -euo pipefail; mkdir -p $(PYDOCS_DIR); deb='$(PYDOCS_DIR)/$(PYDOCS_DEB)'; \
	sha() { sha256sum "$$1" | cut -d' ' -f1; }; \
	fetch() { if command -v curl >/dev/null; then curl -fsSL --retry 2 --connect-timeout 30 -o "$$2" "$$1"; \
	  else $(PYTHON) -c 'import sys, urllib.request as u; u.urlretrieve(sys.argv[1], sys.argv[2])' "$$1" "$$2"; fi; }; \
	if [ -f "$$deb" ] && [ "$$(sha "$$deb")" != $(PYDOCS_SHA256) ]; then \
	  echo "cpu-data: $$deb is not the pinned .deb (SHA-256 $$(sha "$$deb")); downloading it again" >&2; rm -f "$$deb"; \
	fi; \
	if [ ! -f "$$deb" ]; then \
	  for url in $(PYDOCS_URLS); do \
	    part="$$deb.part.$$$$"; rm -f "$$part"; echo "cpu-data: downloading $$url"; \
	    if ! fetch "$$url" "$$part"; then echo "cpu-data: could not download $$url" >&2; \
	    elif [ "$$(sha "$$part")" != $(PYDOCS_SHA256) ]; then \
	      echo "cpu-data: $$url gave SHA-256 $$(sha "$$part"), not the pinned $(PYDOCS_SHA256)" >&2; \
	    else mv -f "$$part" "$$deb"; break; fi; \
	    rm -f "$$part"; \
	  done; \
	  [ -f "$$deb" ] || { echo "cpu-data: no URL gave $(PYDOCS_DEB) with SHA-256 $(PYDOCS_SHA256); tried:" \
	    $(PYDOCS_URLS) "(or put that file into $(PYDOCS_DIR)/ yourself)" >&2; exit 1; }; \
	fi; \
	tmp=$$(mktemp -d '$(PYDOCS_DIR)/.unpack.XXXXXX'); trap 'rm -rf "$$tmp"' EXIT; \
	if command -v dpkg-deb >/dev/null; then dpkg-deb -x "$$deb" "$$tmp"; \
	else ar p "$$deb" data.tar.xz | tar -xJf - -C "$$tmp"; fi; \
	touch "$$tmp/.complete"; rm -rf '$(PYDOCS_TREE)'; mv -T "$$tmp" '$(PYDOCS_TREE)'; \
	echo "cpu-data: Python docs $(PYDOCS_VERSION) in $(PYDOCS_TREE)/usr/share/doc/python3.11/html/_sources"

docs: setup  # the README's claims-to-targets table, from the registry and Snakemake's dry runs
	$(PY) -m gradfidelity docs --readme README.md

lint: setup lint-only

dryrun: setup
	$(VENV)/bin/snakemake -n --config scale=$(SCALE)

clean-results:  # the smoke scale's outputs only; the committed cpu reference results stay
	rm -rf results/smoke paper_tables/smoke figures/smoke .snakemake
